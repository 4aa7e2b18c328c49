"""Leases: who holds which GPU, shared across processes through a directory.

`directory` keeps the lease directory, `records` reads and writes the checked
lease and ticket files, `locking` takes locks other users share, with deadlines.
"""
