"""Many machines at once: per-node snapshots read from Prometheus or from each node's
`/metrics`, for `gpuwatch fleet` and `gpuwatch where`.

This is the fleet's floor beside `gpuwatch.backends`: a source here does for a fleet
what a `Backend` does for one machine. Nothing here imports the placement rules or a
user interface; they import it.
"""
