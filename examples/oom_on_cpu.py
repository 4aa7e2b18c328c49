"""An out-of-memory report without a GPU: gpuwatch.torch.watch() over a simulated device.

    pip install torch --index-url https://download.pytorch.org/whl/cpu   # a CPU-only torch
    python examples/oom_on_cpu.py
    gpuwatch torch-report gpuwatch-oom-*.json

A `SimulatedAllocator` stands for the GPU's caching allocator (`cuda:0`, 64 MiB here). The
model trains on the CPU; each step allocates on the simulated device what its batch's
activations would take on a GPU (and frees it after the step), beside the weights and the
optimizer's state, allocated once. The batch doubles every few steps until a request does
not fit: the simulated device raises `SimulatedOutOfMemory`, as CUDA raises
`torch.OutOfMemoryError`, and the watch writes the report a GPU's would have (what was
asked and free, the modules of the last sampled step, what to do) into --oom-dir.
"""

import argparse

import torch
from torch import nn

import gpuwatch.torch
from gpuwatch.torch import SimulatedAllocator, SimulatedOutOfMemory

FLOAT_BYTES = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oom-dir", default=".", help="where the OOM report goes")
    parser.add_argument("--capacity-mib", type=int, default=64, help="the simulated GPU's memory")
    args = parser.parse_args()

    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.Linear(512, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    device = SimulatedAllocator(capacity_bytes=args.capacity_mib << 20)
    weights = sum(p.numel() for p in model.parameters()) * FLOAT_BYTES
    device.allocate(weights)
    device.allocate(2 * weights)  # AdamW's two moments
    per_sample = sum(m.out_features for m in model if isinstance(m, nn.Linear)) * FLOAT_BYTES

    batch = 64
    try:
        with gpuwatch.torch.watch(
            model, optimizer=optimizer, per_module=True, every=2, source=device,
            oom_dir=args.oom_dir, publish=False,
        ) as memory:  # fmt: skip
            for step in range(1, 1000):
                activations = device.allocate(batch * per_sample)  # raises when full
                inputs = torch.randn(batch, 64)
                model(inputs).pow(2).mean().backward()
                optimizer.step()  # the watch counts this step through the optimizer's hook
                optimizer.zero_grad(set_to_none=True)
                device.free(activations)
                if step % 3 == 0:
                    batch *= 2
    except SimulatedOutOfMemory as error:
        print(f"batch {batch}: {error}")
        print(f"read the report with: gpuwatch torch-report {memory.oom_report_path}")


if __name__ == "__main__":
    main()
