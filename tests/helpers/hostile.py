"""Text that would act on a terminal, in every field another program, user or machine
writes, and the checks that none of it reaches one.

`hostile(tag)` is `tag` followed by `ESCAPES`: OSC sequences that retitle the window and
write the clipboard, CSI sequences, their C1 twins, a lone ESC, BEL, DEL and a bidi
override. A screen that shows the field shows `tag` followed by `SHOWN` (each of those
characters as `?`), so a test can tell the field reached the screen, harmlessly.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping

from gpuwatch.text import printable

ESCAPES = (
    "\x1b]0;PWNED\x1b\\"  # OSC 0, ended by ST: sets the window's title
    "\x1b]52;c;cHduZWQ=\x07"  # OSC 52, ended by BEL: writes the clipboard
    "\x1b[999;999H\x1b[2J"  # CSI: moves the cursor, clears the screen
    "\x9b31m\x9d2;PWNED\x9c"  # the same as C1 controls: CSI, OSC, ST
    "\x1b\x07\x7f"  # a lone ESC, BEL, DEL
    "\u202e"  # right-to-left override: what follows reads backwards
)
SHOWN = printable(ESCAPES)
ACTING = (
    b"\x1b]0;PWNED",
    b"\x1b]52;",
    b"\x1b[999;999H",
    *(ch.encode() for ch in "\x9b\x9c\x9d\x7f\u202e"),
)
"""What must never be among the bytes a screen writes, even one that draws with escapes of
its own (Textual, which ends its own OSC sequences with BEL): the hostile sequences, and
characters no screen of ours writes."""


def hostile(tag: str) -> str:
    return f"{tag}{ESCAPES}"


def shown(tag: str) -> str:
    """How a screen shows `hostile(tag)`, up to its first 10 characters: enough to find."""
    return f"{tag}{SHOWN}"[: len(tag) + 10]


def inert(raw: bytes) -> str:
    """The text of output that holds nothing a terminal acts on: UTF-8 of printable
    characters and new lines only (what `status`, `where`, `--once` and `--json` write
    where no terminal is). Fails naming what else it holds."""
    text = raw.decode("utf-8")
    acting = sorted({ch for ch in text if not (ch.isprintable() or ch == "\n")})
    assert not acting, f"output holds {acting!r}"
    return text


def texts_of(document: object) -> Iterable[str]:
    """Every string in a JSON document, keys too."""
    if isinstance(document, str):
        yield document
    elif isinstance(document, dict):
        for key, value in document.items():
            yield key
            yield from texts_of(value)
    elif isinstance(document, list):
        for item in document:
            yield from texts_of(item)


def clean_env(**more: str) -> dict[str, str]:
    """This environment without gpuwatch's, Slurm's or CUDA's variables, plus `more`."""
    kept = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("GPUWATCH_", "SLURM", "CUDA_"))
    }
    return {**kept, "COLUMNS": "400", "NO_COLOR": "1", **more}


def toml_text(text: str) -> str:
    """`text` as a TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(text)


def scenario(minors: Iterable[int] = (4, 5, 6, 7)) -> str:
    """A node whose every text is hostile: its name, driver and CUDA versions, its GPUs'
    names, a fault (on GPU 2), a process's user and command (on GPU 1); GPU 0 is free."""
    lines = [
        f"hostname = {toml_text(hostile('HOST'))}",
        f"driver_version = {toml_text(hostile('DRIVER'))}",
        f"cuda_driver_version = {toml_text(hostile('CUDA'))}",
    ]
    for index, minor in enumerate(minors):
        lines += ["[[gpu]]", f"minor = {minor}", f"name = {toml_text(hostile(f'GPU{index}'))}"]
        lines += ['load = "constant"', "utilization_pct = 0"]
        if index == 2:
            lines.append(f"fault = {toml_text(hostile('FAULT'))}")
    lines += ["[[process]]", "gpu = 1", "pid = 4242", 'memory = "10GiB"']
    lines += [f"user = {toml_text(hostile('USER'))}", f"command = {toml_text(hostile('CMD'))}"]
    return "\n".join(lines) + "\n"


def squeue_script(python: str, started_at: float) -> str:
    """A stand-in `squeue` answering in `squeue --json`'s 22.05 shape: job 2, running on
    node `vm` since `started_at` on GRES 0-1, its name and user hostile."""
    job = {
        "job_id": 2,
        "array_job_id": 0,
        "array_task_id": None,
        "job_state": "RUNNING",
        "name": hostile("JOBNAME"),
        "user_name": hostile("JOBUSER"),
        "nodes": "vm",
        "job_resources": {"nodes": "vm"},
        "gres_detail": ["gpu:2(IDX:0-1)"],
        "start_time": int(started_at),
        "end_time": 0,
        "time_limit": 90,
    }
    answer = json.dumps({"meta": {}, "errors": [], "jobs": [job]})
    return f"#!{python}\nprint({answer!r})\n"


def exporter_page(labels_of_node: Mapping[str, str] | None = None) -> bytes:
    """A gpuwatch daemon's `/metrics` as a hostile machine would serve it, taken now: one
    node of two GPUs, every label that becomes text hostile (host, GPU model, UUID, bus id,
    driver and CUDA versions, a process's user and program, a job's id and user)."""
    node = {"hostname": hostile("HOST"), **(labels_of_node or {})}
    gpus = [
        {
            "gpu": str(index),
            "uuid": hostile(f"UUID{index}"),
            "pci_bus_id": hostile(f"BUS{index}"),
            "model_name": hostile(f"GPU{index}"),
            **node,
        }
        for index in range(2)
    ]
    lines = [
        _sample("gpuwatch_sampling_up", node, 1),
        _sample("gpuwatch_sample_timestamp_seconds", node, time.time()),
        _sample("gpuwatch_jobs_known", node, 1),
    ]
    versions = {"driver_version": hostile("DRIVER"), "cuda_driver_version": hostile("CUDA")}
    for gpu in gpus:
        lines += [
            _sample("gpuwatch_gpu_info", {**gpu, **versions}, 1),
            _sample("gpuwatch_gpu_up", gpu, 1),
            _sample("gpuwatch_memory_total_bytes", gpu, 80 << 30),
            _sample("gpuwatch_memory_free_bytes", gpu, 70 << 30),
            _sample("gpuwatch_memory_used_bytes", gpu, 10 << 30),
            _sample("gpuwatch_utilization_ratio", gpu, 0.0),
        ]
    process = {**node, "gpu": "1", "uuid": gpus[1]["uuid"], "pid": "4242", "kind": "compute"}
    process |= {"user": hostile("USER"), "process": hostile("CMD")}
    job = {**node, "gpu": "1", "uuid": gpus[1]["uuid"]}
    job |= {"job_id": hostile("JOBID"), "job_user": hostile("JOBUSER")}
    lines += [
        _sample("gpuwatch_process_memory_bytes", process, 10 << 30),
        _sample("gpuwatch_gpu_job_info", job, 1),
    ]
    return ("\n".join(lines) + "\n").encode()


def _sample(name: str, labels: Mapping[str, str], value: float) -> str:
    pairs = ",".join(f'{key}="{_label_value(text)}"' for key, text in labels.items())
    return f"{name}{{{pairs}}} {value!r}"


def _label_value(text: str) -> str:
    """The text format's escapes of a label value: backslash, double quote, new line."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
