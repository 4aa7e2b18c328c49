"""Live GPU memory of a PyTorch training loop: `gpuwatch.torch.watch()`.

    import gpuwatch.torch

    with gpuwatch.torch.watch(model, optimizer=optimizer, per_module=True, every=10):
        for batch in loader:
            ...
            optimizer.step()   # each optimizer step is a watched step

Importing this package does not import torch; `watch()` does, and works without
CUDA (a notice says what is missing). `import gpuwatch` never imports this
package. Inside it, `import torch` is the real torch: imports are absolute.
"""

from __future__ import annotations

from gpuwatch.torch.simulated import SimulatedAllocator, SimulatedOutOfMemory
from gpuwatch.torch.stats import AllocatorStats, CudaStatsSource, StatsSource
from gpuwatch.torch.watcher import Watch, rank_and_world_size, watch

__all__ = [
    "AllocatorStats",
    "CudaStatsSource",
    "SimulatedAllocator",
    "SimulatedOutOfMemory",
    "StatsSource",
    "Watch",
    "rank_and_world_size",
    "watch",
]
