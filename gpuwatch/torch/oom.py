"""Writing the out-of-memory report: facts gathered at the error, files, and a word on stderr.

Runs inside torch's OOM observer (or, when that was not attached yet, as the
error leaves the watched block), so it does little: the allocator's counters,
the last sampled step's modules, the largest live tensors of the device (one
pass over the garbage collector's objects, once), and, when history recording
is on, a snapshot for pytorch.org/memory_viz. Files are named after host, pid
and rank, so ranks never overwrite each other.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import sys
from dataclasses import replace
from typing import Any

from gpuwatch.oomreport import MAX_ITEMS, OomReport, TensorSize, render
from gpuwatch.training import this_hostname


def largest_tensors(device_type: str, limit: int = 10) -> tuple[TensorSize, ...]:
    """The largest live tensors on devices of `device_type`, each storage once."""
    import torch

    seen: dict[int, TensorSize] = {}
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads __class__, which some proxies
        # (torch.distributed's deprecated names) answer with a warning.
        if not issubclass(type(obj), torch.Tensor):
            continue
        try:
            if obj.device.type != device_type:
                continue
            storage = obj.untyped_storage()
            pointer, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError, ReferenceError):
            continue
        if pointer not in seen:
            seen[pointer] = TensorSize(str(tuple(obj.shape)), str(obj.dtype), nbytes)
    return tuple(sorted(seen.values(), key=lambda t: t.nbytes, reverse=True)[:limit])


def write_oom(report: OomReport, directory: str, snapshot: dict[str, Any] | None) -> str:
    """Writes the report as JSON and as text (and the snapshot as a pickle, the format
    memory_viz reads), prints the text to stderr, and returns the JSON's path."""
    os.makedirs(directory, exist_ok=True)
    stem = os.path.join(
        directory,
        f"gpuwatch-oom-{this_hostname()}-{report.pid}-rank{report.rank}-step{report.step}"
        f"-{int(report.at)}",
    )
    if snapshot is not None:
        with open(f"{stem}.pickle", "wb") as file:
            pickle.dump(snapshot, file)
        report = replace(report, snapshot_path=f"{stem}.pickle")
    report = replace(report, modules=report.modules[:MAX_ITEMS], tensors=report.tensors[:MAX_ITEMS])
    with open(f"{stem}.json", "w") as file:
        json.dump(report.to_dict(), file, indent=1)
    text = render(report)
    with open(f"{stem}.txt", "w") as file:
        file.write(text + "\n")
    sys.stderr.write(f"gpuwatch.torch: {text}\n(report: {stem}.txt)\n")
    return f"{stem}.json"


def requested_from_message(message: str) -> int | None:
    """The size in torch's `Tried to allocate 2.00 GiB` message, in bytes."""
    words = message.split()
    for index, word in enumerate(words[:-2]):
        if word == "allocate":
            from gpuwatch.errors import InvalidValueError
            from gpuwatch.units import parse_size

            try:
                return parse_size(words[index + 1] + words[index + 2].rstrip(".;,)"))
            except InvalidValueError:
                return None
    return None
