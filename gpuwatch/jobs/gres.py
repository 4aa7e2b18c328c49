"""GRES indices and the GPUs they are: text in, minor numbers out (pure but for
`minor_number_of`, which asks the device file, and `node_gpu_minors`, which reads the
configuration).

A job's GPUs come as GRES indices (`gpu:2(IDX:0-1)`, `SLURM_JOB_GPUS=0,1`): positions in
the node's list of GPUs as slurmd built it (`gres_conf`). A GPU is named by its device
file's minor number, which NVML reports too; neither the GRES index nor the file's name is
assumed to equal the NVML index.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuwatch.jobs.gres_conf import DetectedGpu, GresSlot, gpu_layout

MAX_INDEX = 1023
"""A GRES index or minor number above this is not believed (nodes hold at most a few
dozen GPUs), nor a list of more indices than this allows: it keeps a hostile
`0-4000000000` from filling memory."""
NVIDIA_MAJOR = 195
"""The NVIDIA driver's device major number (/dev/nvidiaN; N < 254: 254 and 255 are
nvidia-modeset and nvidiactl)."""

_IDX = re.compile(r"(?:^|,)gpu(?::[^,():]*)*\(IDX:([^)]*)\)")
_INDEX = re.compile(r"[0-9]{1,6}")
_NVIDIA_NAME = re.compile(r"/nvidia([0-9]{1,6})$")


def parse_index_list(text: str) -> list[int] | None:
    """`0-1,3` as [0, 1, 3]; `None` for anything else (a range upside down or too big,
    more than `MAX_INDEX` + 1 indices in all)."""
    indices: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not _INDEX.fullmatch(low) or (dash and not _INDEX.fullmatch(high)):
            return None
        first, last = int(low), int(high) if dash else int(low)
        if first > last or last > MAX_INDEX or len(indices) + last - first >= MAX_INDEX + 1:
            return None
        indices.extend(range(first, last + 1))
    return indices


def gpu_indices(gres: str) -> list[int] | None:
    """The GPU GRES indices in one node's GRES detail (`gpu:2(IDX:0-1)`,
    `gpu:a100:1(IDX:4),mps:10`, or before Slurm 19.05 `gpu(IDX:0-1)`); [] when it holds no
    GPU, `None` for garbled indices."""
    indices: list[int] = []
    for match in _IDX.finditer(gres):
        if not match.group(1) or match.group(1) == "N/A":
            continue
        part = parse_index_list(match.group(1))
        if part is None or len(indices) + len(part) > MAX_INDEX + 1:
            return None
        indices.extend(part)
    return sorted(set(indices))


def default_gres_conf(environ: Mapping[str, str]) -> Path:
    """Where Slurm's gres.conf is: beside `SLURM_CONF`, else /etc/slurm/gres.conf."""
    conf = environ.get("SLURM_CONF")
    return (Path(conf).parent if conf else Path("/etc/slurm")) / "gres.conf"


def minor_number_of(path: str) -> int | None:
    """The GPU minor number of a device file: the file's own when it is an NVIDIA GPU's
    character device, else the N of its name `nvidiaN` (a node where the file is absent);
    `None` for anything else (a MIG capability file, a tty)."""
    try:
        status = os.stat(path)
    except OSError:
        status = None
    if status is not None and stat.S_ISCHR(status.st_mode):
        major, minor = os.major(status.st_rdev), os.minor(status.st_rdev)
        return minor if major == NVIDIA_MAJOR and minor < 254 else None
    match = _NVIDIA_NAME.search(path)
    return int(match.group(1)) if match and int(match.group(1)) <= MAX_INDEX else None


def slot_minor(slot: GresSlot) -> int | None:
    """The GPU a GRES index is, by minor number: its device file's; for a MIG device
    (MultipleFiles=) the GPU it is part of, the one `/dev/nvidiaN` among its files."""
    if len(slot.files) == 1:
        return minor_number_of(slot.files[0])
    gpus = [file for file in slot.files if _NVIDIA_NAME.search(file)]
    return minor_number_of(gpus[0]) if len(gpus) == 1 else None


def node_gpu_minors(
    gres_conf: Path,
    slurm_conf: Path | None,
    node: str,
    detected: Sequence[DetectedGpu] | None = None,
) -> list[int | None]:
    """Each GRES index's minor number on `node` (`None` for one that is no GPU of its own);
    `GresOrderUnknown` where slurmd's order cannot be told."""
    slots = gpu_layout(gres_conf, slurm_conf, node).ordered(detected)
    return [slot_minor(slot) for slot in slots]


def minors_of_indices(indices: Sequence[int], minors: Sequence[int | None]) -> tuple[int, ...]:
    """The minor numbers of GRES `indices`, given each GRES index's minor number; an index
    not on the node, or not a GPU of its own, is passed over."""
    found = (minors[index] for index in indices if 0 <= index < len(minors))
    return tuple(sorted({minor for minor in found if minor is not None}))


def step_gpu_minors(
    environ: Mapping[str, str], minors: Sequence[int | None]
) -> tuple[int, ...] | None:
    """The GPUs Slurm gave this step (`SLURM_STEP_GPUS`, else the job's `SLURM_JOB_GPUS`),
    by minor number; `None` outside a Slurm allocation with GPUs or for garbled values.

    The variables hold GRES indices, not CUDA ordinals or NVML indices: `minors[i]` is the
    minor number of GRES index i (`node_gpu_minors`).
    """
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        value = environ.get(name, "").strip()
        if value:
            indices = parse_index_list(value)
            named = indices is not None and all(
                0 <= i < len(minors) and minors[i] is not None for i in indices
            )
            if indices is None or not named:
                return None  # a GPU gres.conf does not name: the step's GPUs are not known
            return minors_of_indices(indices, minors)
    return None
