"""Placement: which GPUs or MIG devices a job gets, and starting it on them.

`choices` and `gpus`/`mig` are pure rules over a snapshot and the leases in
force; `acquire` runs them under the lease directory's lock; `selection` is
`gpuwatch.select()`; `visible`, `cudastate` and `launch` hand the choice to CUDA.
"""
