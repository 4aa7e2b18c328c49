"""Save a checkpoint of a DataParallel model, and load it on a machine without GPUs.

    python examples/dataparallel_checkpoint.py checkpoint.pt

`nn.DataParallel` (and DDP) keep the real model in `.module`, so their
state_dict keys start with `module.`; a plain model does not expect that
prefix. And tensors saved from GPUs remember their device: without
`map_location` a CPU-only machine cannot load them. Both fixed below.
"""

import argparse

import torch
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def save(path: str) -> torch.Tensor:
    """Trains nothing, just saves a wrapped model the way training scripts do."""
    torch.manual_seed(0)
    wrapped = nn.DataParallel(make_model())  # on GPUs this splits batches across them
    if torch.cuda.is_available():
        wrapped = wrapped.cuda()
    torch.save(wrapped.state_dict(), path)  # keys: "module.0.weight", ...
    probe = torch.ones(1, 8)
    return wrapped.module.cpu()(probe).detach()


def load_on_cpu(path: str) -> nn.Module:
    state = torch.load(path, map_location="cpu", weights_only=True)  # GPU tensors -> CPU
    consume_prefix_in_state_dict_if_present(state, "module.")  # "module.0.weight" -> "0.weight"
    model = make_model()
    model.load_state_dict(state)  # strict: every key must match
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="where to write the checkpoint")
    args = parser.parse_args()
    expected = save(args.path)
    restored = load_on_cpu(args.path)
    same = torch.allclose(restored(torch.ones(1, 8)), expected)
    print(f"saved {args.path} with 'module.' keys; loaded on cpu: outputs match={same}")
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
