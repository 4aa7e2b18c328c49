"""Which GPU each of a node's GRES indices is, worked out as slurmd works it out.

A job's GPUs come from Slurm as GRES indices (`gpu:2(IDX:0-1)`, `SLURM_JOB_GPUS=0,1`):
positions in the list of GPUs slurmd built at its start and reported to slurmctld. This
module builds the same list from the same files (Slurm 22.05's src/common/gres.c,
src/plugins/gres/gpu/gres_gpu.c, src/plugins/gres/common/gres_common.c):

1. gres.conf (`slurm_config` reads it as Slurm does: continued lines, `include`, any case
   of keys): first every line that starts with `Name=`, then every line that starts with
   `NodeName=` naming this node, each in file order (slurmd keeps two lists and joins
   them). Only `Name=gpu` lines count. `File=` names one GPU per device file (a hostlist:
   `/dev/nvidia[0-3,5]`); `MultipleFiles=` names one GPU (a MIG device) by several files.
2. slurm.conf's `Gres=` for the node: for each GPU type it names, in its order, the
   gres.conf lines of that type in turn, up to its count (a line with more files is cut,
   a line of a type slurm.conf does not name is left out).
3. `AutoDetect`: off (or unset), that list is the order. With `nvml` and `File=` lines,
   slurmd keeps the lines' GPUs that NVML found and orders them as NVML enumerates them
   (`_sort_gpu_by_file`, then `_sort_gpu_by_links_order`: the links matrix is NVML's
   order), those NVML did not find after them by file name: `GpuLayout.ordered` does that
   given NVML's GPUs. Any other detector, or `AutoDetect` with no `File=` (slurmd takes
   whatever the detector found), or with `MultipleFiles=`: the order is not known here,
   and `GresOrderUnknown` says why; nothing is guessed.

Not modelled, because slurmd would refuse to start or drop the GPU with an error of its
own: mismatching `Cores=`/`Links=` under AutoDetect, a `File=` that does not exist.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec
from msgspec.structs import replace

from gpuwatch.jobs.hostlist import HostlistError, HostlistTooLarge, expand_hostlist, in_hostlist
from gpuwatch.jobs.job_table import MAX_GPUS_PER_NODE
from gpuwatch.jobs.slurm_config import (
    ConfigLine,
    SlurmConfigError,
    UnreadableConfig,
    read_config,
)
from gpuwatch.models import GpuSample

_DETECTORS = ("nvml", "rsmi", "oneapi", "nrt", "nvidia")
"""slurmd's AutoDetect values that find GPUs themselves (matched as slurmd does: a
substring, any case; 22.05 knows nvml, rsmi, oneapi)."""
_COUNT = re.compile(r"^([0-9]+)([kKmMgG]?)$")
_MULTIPLIERS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_NATURAL = re.compile(r"([0-9]+)")
_GPU_FILE = re.compile(r"/nvidia[0-9]+$")


class GresOrderUnknown(Exception):
    """The order of a node's GPUs cannot be told from here; the message says why."""


class GresSlot(msgspec.Struct, frozen=True):
    """One GRES index: a GPU by its device file, or a MIG device by several (MultipleFiles)."""

    files: tuple[str, ...]
    type_name: str | None = None


class DetectedGpu(msgspec.Struct, frozen=True):
    """A GPU as slurmd's NVML detection names it: `/dev/nvidiaN` (N its minor number) and
    the model, lower case with `_` for spaces (`nvidia_a100-sxm4-40gb`)."""

    file: str
    type_name: str


class GpuLayout(msgspec.Struct, frozen=True):
    """A node's GPUs in gres.conf's order after slurm.conf's; `by_nvml` when slurmd orders
    them by NVML's enumeration (`AutoDetect=nvml` with `File=` lines)."""

    slots: tuple[GresSlot, ...]
    by_nvml: bool = False
    source: str = ""
    """The files read, for messages."""

    def ordered(self, detected: Sequence[DetectedGpu] | None) -> tuple[GresSlot, ...]:
        """The GPUs in GRES index order. `detected`: NVML's GPUs in NVML's index order,
        needed where `by_nvml`; `GresOrderUnknown` when it is needed and not given."""
        if not self.by_nvml:
            return self.slots
        if detected is None:
            raise GresOrderUnknown(
                f"{self.source}: AutoDetect=nvml, so slurmd numbers the GPUs in NVML's order, "
                "which this reader was not told (the daemon knows it)"
            )
        return nvml_order(self.slots, detected)


def detected_gpus(gpus: Sequence[GpuSample]) -> tuple[DetectedGpu, ...] | None:
    """The GPUs as slurmd's NVML detection finds them, in NVML's order; `None` where a
    minor number is not known (then neither is slurmd's order)."""
    ordered = sorted(gpus, key=lambda gpu: gpu.index)
    if not ordered or any(gpu.minor_number is None for gpu in ordered):
        return None
    return tuple(
        DetectedGpu(f"/dev/nvidia{gpu.minor_number}", slurm_type_of(gpu.name or ""))
        for gpu in ordered
    )


def slurm_type_of(name: str) -> str:
    """The GPU type slurmd's NVML detection gives a model name (`NVIDIA A100-SXM4-40GB`:
    `nvidia_a100-sxm4-40gb`)."""
    return name.lower().replace(" ", "_")


def gpu_layout(gres_conf: Path, slurm_conf: Path | None, node: str) -> GpuLayout:
    """`node`'s GPUs per gres.conf and slurm.conf; `GresOrderUnknown` where slurmd's order
    cannot be told (or slurmd would refuse the files)."""
    source = str(gres_conf)
    try:
        lines = read_config(gres_conf, slurm_conf=slurm_conf)
        records, detector = _gpu_records(lines, node, source)
    except SlurmConfigError as error:
        raise GresOrderUnknown(str(error)) from None
    _check_uniform(records, source)
    records = _merge_slurm_conf(records, slurm_conf, node, source)
    if detector is None:
        if not any(slot.files for slot in records):
            raise GresOrderUnknown(f"{source} lists no GPU File= for node {node}")
        return GpuLayout(tuple(records), source=source)
    if detector != "nvml" or not records or not all(slot.files for slot in records):
        why = "names no GPU File=" if not any(s.files for s in records) else "is not NVML"
        raise GresOrderUnknown(
            f"{source}: AutoDetect={detector} for node {node} and {why}: slurmd numbers the "
            "GPUs in the order its detection found them, which cannot be read here"
        )
    if any(len(slot.files) > 1 or not _GPU_FILE.search(slot.files[0]) for slot in records):
        raise GresOrderUnknown(
            f"{source}: MIG devices (nvidia-caps files) with AutoDetect=nvml: slurmd's order "
            "of them is not known here"
        )
    return GpuLayout(tuple(records), by_nvml=True, source=source)


def _gpu_records(
    lines: Iterable[ConfigLine], node: str, source: str
) -> tuple[list[GresSlot], str | None]:
    """The GPU lines slurmd keeps for `node`, `Name=` lines first, and the AutoDetect in
    force (node-local over global; `None` for off)."""
    named: list[GresSlot] = []
    by_node: list[GresSlot] = []
    global_detect: str | None = None
    local_detect: str | None = None
    for line in lines:
        kind = line.first_key
        if kind == "autodetect":
            if len(line.pairs) > 1:
                raise GresOrderUnknown(f"{line.where}: slurmd refuses text after AutoDetect=")
            global_detect = line.pairs[0][1]
        elif kind == "name":
            named.extend(_slots(line, source))
            _check_count(len(named) + len(by_node), line.where)
        elif kind == "nodename":
            if not _names(node, line.pairs[0][1], line.where):
                continue
            if (detect := line.get("AutoDetect")) is not None:
                local_detect = _same_detect(local_detect, detect, line.where)
            if line.get("Name") is not None:
                by_node.extend(_slots(line, source))
                _check_count(len(named) + len(by_node), line.where)
        else:
            raise GresOrderUnknown(f"{line.where}: slurmd refuses the key {line.pairs[0][0]}")
    detect = local_detect if local_detect is not None else global_detect
    return named + by_node, _detector(detect)


def _check_count(count: int, where: str) -> None:
    if count > MAX_GPUS_PER_NODE:
        raise GresOrderUnknown(
            f"{where}: gres.conf names more than {MAX_GPUS_PER_NODE} GPUs for one node, "
            "more than any node holds"
        )


def _names(node: str, expression: str, where: str) -> bool:
    """Whether `NodeName=expression` names `node`; `GresOrderUnknown` for one beyond what is
    read here (which slurmd might take: then what it names is not known)."""
    try:
        return in_hostlist(node, expression)
    except HostlistTooLarge as error:
        raise GresOrderUnknown(f"{where}: NodeName={error}") from None


def _same_detect(before: str | None, value: str, where: str) -> str:
    if before is not None and _detector(before) != _detector(value):
        raise GresOrderUnknown(f"{where}: slurmd refuses a second, different AutoDetect")
    return value


def _detector(value: str | None) -> str | None:
    """slurmd's reading of an AutoDetect value: a detector's name, or `None` for off (an
    unknown value is off too, after an error in slurmd's log)."""
    if value is None:
        return None
    lowered = value.lower()
    return next((name for name in _DETECTORS if name in lowered), None)


def _slots(line: ConfigLine, source: str) -> list[GresSlot]:
    """The GPUs of one `Name=gpu` line (none for other GRES)."""
    name = line.get("Name") or ""
    if name.lower() != "gpu":
        return []
    type_name = line.get("Type")
    single = line.get("File") or line.get("Files")
    multiple = line.get("MultipleFiles")
    if single is not None and multiple is not None:
        raise GresOrderUnknown(f"{line.where}: slurmd refuses File= with MultipleFiles=")
    try:
        files = expand_hostlist(single or multiple or "")
    except HostlistTooLarge as error:
        raise GresOrderUnknown(f"{line.where}: the files: {error}") from None
    except HostlistError as error:
        raise GresOrderUnknown(f"{line.where}: slurmd cannot read the files: {error}") from None
    if multiple is not None:
        if len(files) < 2:
            raise GresOrderUnknown(f"{line.where}: MultipleFiles= names one file")
        return [GresSlot(tuple(files), type_name)]
    count = line.get("Count")
    if single is None:  # a count of GPUs without device files
        return [GresSlot((), type_name)] * _count(count or "1", line.where)
    if count is not None and _count(count, line.where) != len(files):
        raise GresOrderUnknown(f"{line.where}: slurmd refuses Count= unlike the files' number")
    return [GresSlot((file,), type_name) for file in files]


def _count(text: str, where: str) -> int:
    match = _COUNT.match(text.strip())
    if match is None:
        raise GresOrderUnknown(f"{where}: slurmd refuses the count {text[:40]!r}")
    count = int(match.group(1)) * _MULTIPLIERS[match.group(2).lower()]
    if count > 4096:
        raise GresOrderUnknown(f"{where}: {count} GPUs on one node is not believed")
    return count


def _check_uniform(records: Sequence[GresSlot], source: str) -> None:
    """slurmd refuses GPU lines where some have File= and others not, or some Type=."""
    if len({bool(slot.files) for slot in records}) > 1:
        raise GresOrderUnknown(f"{source}: slurmd refuses GPU lines with and without File=")
    if len({slot.type_name is not None for slot in records}) > 1:
        raise GresOrderUnknown(f"{source}: slurmd refuses GPU lines with and without Type=")


def _merge_slurm_conf(
    records: list[GresSlot], slurm_conf: Path | None, node: str, source: str
) -> list[GresSlot]:
    """slurmd's `_merge_config`: gres.conf's GPU lines taken in turn for each GPU type of
    slurm.conf's `Gres=` for the node, in its order, up to its count."""
    wanted = _slurm_conf_gpus(slurm_conf, node) if slurm_conf is not None else None
    if wanted is None:
        if len({slot.type_name for slot in records}) > 1:
            raise GresOrderUnknown(
                f"{source} names several GPU types, whose order is slurm.conf's Gres=, and "
                f"slurm.conf does not say it for node {node}"
            )
        return records
    left = list(records)
    merged: list[GresSlot] = []
    for type_name, wanted_count in wanted:
        count = wanted_count
        while count > 0:
            position = next(
                (
                    i
                    for i, slot in enumerate(left)
                    if type_name is None or (slot.type_name or "").lower() == type_name.lower()
                ),
                None,
            )
            if position is None:
                break  # the rest are fileless: no device, no index (slurmd drops them)
            slot = left.pop(position)
            if type_name is None:
                slot = replace(slot, type_name=None)
            merged.append(slot)
            count -= 1
    return merged


def _slurm_conf_gpus(slurm_conf: Path, node: str) -> list[tuple[str | None, int]] | None:
    """slurm.conf's GPUs for `node`: (type or `None`, count) in `Gres=`'s order; `None`
    where slurm.conf cannot be read or defines no node at all (then nothing is merged).
    `GresOrderUnknown` where it defines nodes, but not this one: Slurm calls this node
    otherwise, and whatever is read for it would be another node's."""
    default_gres, any_node = "", False
    try:
        for line in read_config(slurm_conf, slurm_conf=slurm_conf):
            if line.first_key != "nodename":
                continue
            names = line.pairs[0][1]
            gres = line.get("Gres")
            if names.lower() == "default":
                default_gres = gres if gres is not None else default_gres
                continue
            any_node = True
            if _names(node, names, line.where):
                return _gpu_types(gres if gres is not None else default_gres)
    except UnreadableConfig as error:  # there, but not to be read: never merged without it
        raise GresOrderUnknown(str(error)) from None
    except SlurmConfigError:
        return None
    if any_node:
        raise GresOrderUnknown(
            f"{slurm_conf} defines no node named {node}: Slurm knows this node by another "
            "name (give the daemon --node-name, or set SLURMD_NODENAME)"
        )
    return None


def _gpu_types(gres: str) -> list[tuple[str | None, int]]:
    """`gpu:a100:2(S:0),gpu:v100:1,mps:100` as [("a100", 2), ("v100", 1)]; `gpu:4` as
    [(None, 4)] (slurm.conf's `_get_gres_cnt` and `gres_add_type`)."""
    counts: dict[str | None, int] = {}
    for token in gres.split(","):
        parts = token.split("(", 1)[0].strip().split(":")
        if parts[0] != "gpu":
            continue
        count = 1
        if len(parts) > 1 and _COUNT.match(parts[-1]):
            count = _count(parts.pop(), "slurm.conf")
        kinds = [part for part in parts[1:] if part.lower() != "no_consume"]
        type_name = kinds[0] if kinds else None
        counts[type_name] = counts.get(type_name, 0) + count
    if None in counts and len(counts) > 1:  # typed and untyped: the untyped are the total
        total = counts.pop(None)
        return [(None, total)]
    return list(counts.items())


def nvml_order(slots: Sequence[GresSlot], detected: Sequence[DetectedGpu]) -> tuple[GresSlot, ...]:
    """slurmd's `_merge_system_gres_conf` for one-file GPUs: each slot matched to the GPU
    NVML found with its file (and its type, where the slot names one: NVML's model name
    cut to the slot's type where that is part of it); matched GPUs in NVML's order, then
    the rest by file name."""
    types = _normalized_types(slots, detected)
    taken: set[int] = set()
    matched: list[tuple[int, GresSlot]] = []
    alone: list[GresSlot] = []
    for slot in sorted(slots, key=lambda s: natural_key(s.files[0])):
        found = next(
            (
                i
                for i, gpu in enumerate(detected)
                if i not in taken
                and gpu.file == slot.files[0]
                and (slot.type_name is None or types[i] == slot.type_name)
            ),
            None,
        )
        if found is None:
            alone.append(slot)
        else:
            taken.add(found)
            matched.append((found, slot))
    return tuple([slot for _, slot in sorted(matched, key=lambda m: m[0])] + alone)


def _normalized_types(
    slots: Sequence[GresSlot], detected: Sequence[DetectedGpu]
) -> list[str | None]:
    """slurmd's `_normalize_sys_gres_types`: each detected GPU's type cut to the first
    unused slot type that is part of it, longest types first."""
    unused = sorted(
        (slot.type_name for slot in slots if slot.type_name is not None),
        key=lambda name: (-len(name), name),
    )
    if not unused:
        return [None for _ in detected]
    types: list[str | None] = [gpu.type_name for gpu in detected]
    for i in sorted(range(len(detected)), key=lambda i: (-len(detected[i].type_name), i)):
        lowered = detected[i].type_name.lower()
        match = next((name for name in unused if name.lower() in lowered), None)
        if match is not None:
            unused.remove(match)
            types[i] = match
    return types


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Slurm's `strnatcmp` order: runs of digits compare as numbers (`nvidia2` before
    `nvidia10`)."""
    return tuple(
        (1, int(part)) if part.isdigit() else (0, part) for part in _NATURAL.split(text) if part
    )
