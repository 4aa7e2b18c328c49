"""What tests share: harnesses of real parts, stand-ins, and waiting for a condition.

Test modules import from here (or get fixtures from `conftest.py`), never from each other.
"""
