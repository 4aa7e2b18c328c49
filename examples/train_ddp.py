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
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(rank)  # each rank sees its own shard of data
    inputs = torch.randn(256, 16, device=device)
    targets = inputs.sum(dim=1, keepdim=True)
    torch.manual_seed(0)  # ... but all start from the same weights
    model = DistributedDataParallel(
        nn.Linear(16, 1).to(device), device_ids=[local_rank] if use_cuda else None
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()  # gradients are averaged across ranks here
        optimizer.step()
    if rank == 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")
        print(
            f"world={dist.get_world_size()} device={device} CUDA_VISIBLE_DEVICES={visible} "
            f"loss={loss.item():.4f}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
