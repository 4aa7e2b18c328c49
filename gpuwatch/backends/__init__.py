"""Where snapshots come from: the `Backend` interface and `open_backend()`.

- `nvml`: the GPUs of this machine, through the NVIDIA driver.
- `sim`: a simulated node (`--sim 4`, or `--sim scenario.toml`).

Everything here is imported only when needed: `import gpuwatch` never loads
pynvml, and on a machine without the NVIDIA library `open_backend()` fails
before loading the data model.
"""

from __future__ import annotations

import os

from gpuwatch.errors import DriverNotFoundError, InvalidValueError

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from gpuwatch.backends.base import Backend, SampleScope

__all__ = ["BACKEND_KINDS", "Backend", "SampleScope", "open_backend"]

BACKEND_KINDS = ("auto", "nvml", "sim")
DEFAULT_SIM_GPUS = 4
_NVML_LIBRARY = "libnvidia-ml.so.1"


def open_backend(kind: str | None = None, sim: str | None = None) -> Backend:
    """Opens the backend asked for, by argument or else by environment.

    `kind` is `auto` (the NVIDIA driver), `nvml` or `sim`; when `None`,
    `GPUWATCH_BACKEND` decides (default `auto`). `sim` is a GPU count or a
    scenario file; when `None`, `GPUWATCH_SIM` gives it. Asking for a simulated
    node implies the `sim` backend; `sim` alone simulates 4 GPUs.
    """
    kind = kind or os.environ.get("GPUWATCH_BACKEND") or "auto"
    if kind not in BACKEND_KINDS:
        raise InvalidValueError(
            f"unknown backend {kind!r}: choose one of {', '.join(BACKEND_KINDS)}"
        )
    if sim and kind == "nvml":
        raise InvalidValueError("--sim simulates GPUs, so it cannot go with --backend nvml")
    if kind != "nvml" and sim is None:
        sim = os.environ.get("GPUWATCH_SIM") or None
    if sim or kind == "sim":
        from gpuwatch.backends.scenario import parse_sim_spec
        from gpuwatch.backends.sim import SimBackend

        return SimBackend(parse_sim_spec(sim or str(DEFAULT_SIM_GPUS)))
    if not _nvml_library_loads():
        raise DriverNotFoundError(f"NVIDIA driver not found ({_NVML_LIBRARY} could not be loaded)")
    try:
        from gpuwatch.backends.nvml import NvmlBackend
    except ImportError as error:
        raise DriverNotFoundError(
            f"the NVIDIA management bindings could not be loaded ({error}): "
            "pip install nvidia-ml-py"
        ) from error
    return NvmlBackend()


def _nvml_library_loads() -> bool:
    """Whether the driver's library is there, asked before paying to import the bindings.

    On a machine without a GPU this answers in a millisecond, where importing
    pynvml to be told the same would cost tens.
    """
    import ctypes

    try:
        ctypes.CDLL(_NVML_LIBRARY)
    except OSError:
        return False
    return True


def __getattr__(name: str) -> object:
    if name in ("Backend", "SampleScope"):
        from gpuwatch.backends import base

        return getattr(base, name)
    raise AttributeError(f"module 'gpuwatch.backends' has no attribute {name!r}")
