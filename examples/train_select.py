"""Train on the GPU gpuwatch picks for this script, or on the CPU where there is none.

    python examples/train_select.py --steps 200

The first two lines are the whole recipe: choose a GPU before torch touches
CUDA, then ask for the device to use.
"""

import gpuwatch

gpuwatch.select(min_free="2GiB", fallback="cpu")  # before anything touches CUDA

import argparse  # noqa: E402 - after select(), on purpose

import torch  # noqa: E402
from torch import nn  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    device = gpuwatch.device()  # cuda:0 of the selection, or cpu
    torch.manual_seed(0)
    inputs = torch.randn(512, 16, device=device)
    targets = inputs @ torch.randn(16, 1, device=device) + 0.1 * torch.randn(512, 1, device=device)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
    print(f"device={device} steps={args.steps} loss={loss.item():.4f}")


if __name__ == "__main__":
    main()
