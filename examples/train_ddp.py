"""Data-parallel training over the GPUs `gpuwatch pick` chose, one process per GPU.

    gpuwatch pick -n 2 -- torchrun --standalone --nproc-per-node 2 examples/train_ddp.py

pick sets CUDA_VISIBLE_DEVICES to the two GPUs and leases them while torchrun
runs; each rank then uses `cuda:LOCAL_RANK` of those. Without GPUs (or with a
CPU build of torch) the ranks train on the CPU over gloo, so the same command
works on a laptop.
"""

import argparse
import os

import torch
import torch.distributed as dist

# Imported before init_process_group() on purpose. Its functions take `group=group.WORLD`
# as a default, evaluated on import: imported later (DDP does), they would keep the process
# group alive after destroy_process_group(), and a gloo worker thread still running when
# Python exits aborts the rank ("terminate called without an active exception").
import torch.distributed.nn
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def train(steps: int, device: torch.device) -> float:
    """Trains a tiny model on this rank's shard; returns the last loss."""
    torch.manual_seed(dist.get_rank())  # each rank sees its own shard of data
    inputs = torch.randn(256, 16, device=device)
    targets = inputs.sum(dim=1, keepdim=True)
    torch.manual_seed(0)  # ... but all start from the same weights
    model = DistributedDataParallel(
        nn.Linear(16, 1).to(device), device_ids=[device.index] if device.type == "cuda" else None
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()  # gradients are averaged across ranks here
        optimizer.step()
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    try:
        local_rank = int(os.environ["LOCAL_RANK"])
        device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(device)
        loss = train(args.steps, device)
        if dist.get_rank() == 0:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")
            print(
                f"world={dist.get_world_size()} device={device} CUDA_VISIBLE_DEVICES={visible} "
                f"loss={loss:.4f}"
            )
    finally:
        # The model went with train(), so nothing holds the process group any more: this
        # stops the backend's threads now, not during interpreter shutdown.
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
