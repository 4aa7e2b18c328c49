"""Slurm's notations for nodes and GPUs, and gres.conf: text in, facts out (pure but for
`minor_number_of`, which asks the device file).

A job's GPUs come as GRES indices (`gpu:2(IDX:0-1)`, `SLURM_JOB_GPUS=0,1`): positions in
the node's list of GPU device files in gres.conf (`Name=gpu File=/dev/nvidia[0-3]`), in the
order gres.conf names them. A device file is a GPU by its minor number, which NVML reports
too; neither the GRES index nor the file's name is assumed to equal the NVML index.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

MAX_INDEX = 1023
"""A GRES index or minor number above this is not believed (nodes hold at most a few
dozen GPUs); it keeps a hostile `0-4000000000` from filling memory."""
MAX_NAMES = 4096
"""At most this many names from one hostlist expression (a job spans at most this many
nodes worth looking at; more is garbage)."""

_IDX = re.compile(r"(?:^|,)gpu(?::[^,():]*)*\(IDX:([^)]*)\)")
_NVIDIA_NAME = re.compile(r"nvidia(\d+)$")
_GRES_LINE_KEY = re.compile(r"(?i)(?:^|\s)(\w+)=(\S*)")


def parse_index_list(text: str) -> list[int] | None:
    """`0-1,3` as [0, 1, 3]; `None` for anything else (a range upside down or too big)."""
    indices: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdecimal() or (dash and not high.isdecimal()):
            return None
        first, last = int(low), int(high) if dash else int(low)
        if first > last or last > MAX_INDEX:
            return None
        indices.extend(range(first, last + 1))
    return indices


def gpu_indices(gres: str) -> list[int] | None:
    """The GPU GRES indices in one node's GRES detail (`gpu:2(IDX:0-1)`,
    `gpu:a100:1(IDX:4),mps:10`); [] when it holds no GPU, `None` for garbled indices."""
    indices: list[int] = []
    for match in _IDX.finditer(gres):
        if not match.group(1) or match.group(1) == "N/A":
            continue
        part = parse_index_list(match.group(1))
        if part is None:
            return None
        indices.extend(part)
    return sorted(set(indices))


def expand_hostlist(expression: str) -> list[str]:
    """A Slurm hostlist (`node[01-03,07],gpu14`) as names; [] for one that does not parse
    or names more than `MAX_NAMES`."""
    names: list[str] = []
    for part in _top_level_parts(expression):
        expanded = _expand_one(part)
        if expanded is None or len(names) + len(expanded) > MAX_NAMES:
            return []
        names.extend(expanded)
    return names


def _top_level_parts(expression: str) -> list[str]:
    """`a[1,2],b` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for position, char in enumerate(expression):
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            parts.append(expression[start:position])
            start = position + 1
    parts.append(expression[start:])
    return [part.strip() for part in parts if part.strip()]


def _expand_one(name: str) -> list[str] | None:
    opening = name.find("[")
    if opening < 0:
        return None if "]" in name else [name]
    closing = name.find("]", opening)
    if closing < 0:
        return None
    rests = _expand_one(name[closing + 1 :])
    if rests is None:
        return None
    out: list[str] = []
    for piece in name[opening + 1 : closing].split(","):
        low, dash, high = piece.partition("-")
        if not low.isdecimal() or (dash and not high.isdecimal()):
            return None
        first, last = int(low), int(high) if dash else int(low)
        if first > last or (last - first + 1) * len(rests) + len(out) > MAX_NAMES:
            return None
        width = len(low)
        stem = name[:opening]
        out.extend(f"{stem}{n:0{width}d}{rest}" for n in range(first, last + 1) for rest in rests)
    return out


def gres_gpu_files(gres_conf: str, node: str) -> list[str]:
    """The GPU device files gres.conf gives `node`, in its order: GRES index i is the i-th.

    Lines for other nodes (`NodeName=` not naming `node`) and other GRES are passed over,
    as are `AutoDetect`-only lines (which name no file).
    """
    files: list[str] = []
    for raw in gres_conf.splitlines():
        line = raw.split("#", 1)[0]
        keys = {key.lower(): value for key, value in _GRES_LINE_KEY.findall(line)}
        if keys.get("name", "").lower() != "gpu" or "file" not in keys:
            continue
        if "nodename" in keys and node not in expand_hostlist(keys["nodename"]):
            continue
        files.extend(expand_hostlist(keys["file"]))
    return files


def default_gres_conf(environ: Mapping[str, str]) -> Path:
    """Where Slurm's gres.conf is: beside `SLURM_CONF`, else /etc/slurm/gres.conf."""
    conf = environ.get("SLURM_CONF")
    return (Path(conf).parent if conf else Path("/etc/slurm")) / "gres.conf"


def minor_number_of(path: str) -> int | None:
    """The minor number of a GPU's device file: the file's own when it is a character
    device, else the N of its name `nvidiaN` (a node where the file is absent)."""
    try:
        status = os.stat(path)
    except OSError:
        status = None
    if status is not None and stat.S_ISCHR(status.st_mode):
        return os.minor(status.st_rdev)
    match = _NVIDIA_NAME.search(path)
    return int(match.group(1)) if match and int(match.group(1)) <= MAX_INDEX else None


def minors_of_indices(indices: Sequence[int], minors: Sequence[int | None]) -> tuple[int, ...]:
    """The minor numbers of GRES `indices`, given each GRES index's minor number (from
    gres.conf); an index gres.conf does not name is passed over."""
    found = (minors[index] for index in indices if 0 <= index < len(minors))
    return tuple(sorted({minor for minor in found if minor is not None}))


def step_gpu_minors(
    environ: Mapping[str, str], minors: Sequence[int | None]
) -> tuple[int, ...] | None:
    """The GPUs Slurm gave this step (`SLURM_STEP_GPUS`, else the job's `SLURM_JOB_GPUS`),
    by minor number; `None` outside a Slurm allocation with GPUs or for garbled values.

    The variables hold GRES indices, not CUDA ordinals or NVML indices: `minors[i]` is the
    minor number of gres.conf's i-th GPU file (`gres_gpu_files` then `minor_number_of`).
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
