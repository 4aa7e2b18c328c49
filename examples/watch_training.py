"""Watch a training loop's GPU memory live, per step and per module, with gpuwatch.torch.

    python examples/watch_training.py --steps 300
    torchrun --standalone --nproc-per-node 2 examples/watch_training.py   # one report per rank

While it runs, `curl --unix-socket $XDG_RUNTIME_DIR/gpuwatch.sock http://x/v1/training`
(with `gpuwatch daemon` up) shows each rank's allocated, reserved and peak memory, its
fragmentation, and its largest modules. On a CPU build of torch the allocator figures are
left out (one notice says so) and the per-module view comes from the tensors each module
produces. An out-of-memory error leaves a report in --oom-dir for `gpuwatch torch-report`.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn

import gpuwatch
import gpuwatch.torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=10, help="sample modules every N steps")
    parser.add_argument("--oom-dir", default=".", help="where an OOM report goes")
    args = parser.parse_args()

    distributed = "WORLD_SIZE" in os.environ
    if not distributed:
        gpuwatch.select(fallback="cpu")  # a free GPU, chosen before CUDA starts
    device = gpuwatch.device() if not distributed else _ddp_device()
    model = nn.Sequential(
        nn.Linear(64, 512), nn.ReLU(inplace=True), nn.Linear(512, 512), nn.ReLU(inplace=True),
        nn.Linear(512, 1),
    ).to(device)  # fmt: skip
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    with gpuwatch.torch.watch(
        model, optimizer=optimizer, per_module=True, every=args.every, oom_dir=args.oom_dir
    ) as memory:
        for _ in range(args.steps):
            inputs = torch.randn(256, 64, device=device)
            loss = (model(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
            loss.backward()
            optimizer.step()  # the watch counts this step through the optimizer's hook
            optimizer.zero_grad(set_to_none=True)
        largest = ", ".join(module.name for module in memory.last_modules[:3])
        rank, world_size = gpuwatch.torch.rank_and_world_size()
        print(
            f"rank={rank}/{world_size} device={device} steps={memory.steps} "
            f"largest modules: {largest} loss={loss.item():.4f}"
        )
    if distributed:
        dist.barrier()  # no rank tears gloo down while a peer still sends (it aborts the peer)
        dist.destroy_process_group()


def _ddp_device() -> torch.device:
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    if not use_cuda:
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    return device


if __name__ == "__main__":
    main()
