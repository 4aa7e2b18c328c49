"""Abuse by scenario files: 1000 spoilt ones through status, pick and the daemon's sampling.

    python bench/abuse_scenarios.py [COUNT]

Each file is a sound scenario (a few GPUs, a few processes) spoilt at random in up to
three places: a value made NaN, infinite, 400 digits long, negative, of the wrong type or
full of terminal escapes; a key left out or unknown; the file cut short, nested a thousand
deep or not text at all. The spoiling is seeded, so every run sees the same files.

Prints how many files loaded and how many were refused (one line, exit code 2), and the
figures that must stay 0: tracebacks (a crash, or an exit code the command never gives for
a scenario), non-JSON outputs (`status --json` or the daemon's snapshot printing NaN,
Infinity or anything else that is not strict JSON) and hangs.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import run_gpuwatch

from gpuwatch.backends import open_backend
from gpuwatch.daemon.metrics import exposition
from gpuwatch.daemon.view import View
from gpuwatch.errors import ScenarioError
from gpuwatch.sampling.poller import PollState

SEED = 26
HANG_S = 30
SOUND_TOP = {"hostname": "node1", "driver_version": "580.95.05", "seed": 7}
SOUND_GPUS = [
    {"model": "H100-80GB", "count": 2, "load": "sine", "utilization_pct": [10, 90]},
    {"model": "A100-40GB", "memory_reserved": "500MiB", "unsupported": ["fan_pct"]},
    {"model": "A100-80GB", "mig": ["1g.10gb", "3g.40gb"]},
]
SOUND_PROCESSES = [
    {"gpu": 0, "pid": 4242, "user": "alice", "command": "python train.py", "memory": "20GiB"},
    {"gpu": 1, "pid": 4243, "kind": "graphics", "memory": ["1GiB", "2GiB"], "sm": 40},
    {"gpu": 3, "pid": 4244, "mig": 1, "memory": "5GiB"},  # GPU 3: the A100 in MIG mode
]
SPOILT_VALUES: list[Any] = [
    math.nan,
    math.inf,
    -math.inf,
    -1,
    0,
    2**63 - 1,
    -(2**63),
    10**6,
    4_194_305,
    1e300,
    True,
    [],
    [1, [2, [3]]],
    "",
    "1" * 400 + "G",
    "9" * 400,
    "-1G",
    "1025TiB",
    "0.001s",
    "nan",
    "\u0663",
]
SPOILT_TEXT = ["", "\x1b[2J\x1b]0;owned\x07", "\u202e\u2066\u200bgpj.exe", "a\nb\rc", "x" * 10_000]
UNKNOWN_KEYS = ["colour", "count ", "GPU", "mig device", "pid\u200b"]
# What each command may answer a scenario with; anything else is a crash.
ALLOWED_EXITS = {"status": {0, 2}, "pick": {0, 2, 3, 4}}


def spoilt_scenario(chance: random.Random) -> bytes:
    """One sound scenario spoilt in up to three places: a value (text another user would
    write, such as a command, full of what a terminal acts on, loads), a key, or the file."""
    top = dict(SOUND_TOP)
    gpus = [dict(gpu) for gpu in SOUND_GPUS]
    processes = [dict(process) for process in chance.sample(SOUND_PROCESSES, chance.randint(0, 3))]
    tables = [top, *gpus, *processes]
    for _ in range(chance.randint(0, 3)):
        table = chance.choice(tables)
        spoil = chance.randrange(9)
        if spoil < 3:  # text another user would write: loads, and must be shown safely
            key = chance.choice(["hostname", "driver_version", "name", "user", "command"])
            table[key] = chance.choice(SPOILT_TEXT)
        elif spoil < 7:  # a value, of a key it has or one it could have
            key = chance.choice([*table, "count", "memory_total", "power_limit_w", "period"])
            table[key] = chance.choice(SPOILT_VALUES)
        elif spoil < 8 and table:
            del table[chance.choice(list(table))]
        else:
            table[chance.choice(UNKNOWN_KEYS)] = chance.choice(SPOILT_VALUES)
    text = toml_text(top, gpus, processes).encode()
    ending = chance.randrange(20)
    if ending == 0:
        return text[: chance.randrange(len(text) + 1)]  # cut short
    if ending == 1:
        return bytes(chance.randrange(256) for _ in range(chance.randrange(200)))
    if ending == 2:
        depth = chance.choice([100, 1000, 5000])
        return text + f"deep = {'[' * depth}{']' * depth}\n".encode()
    return text


def toml_text(
    top: dict[str, Any], gpus: list[dict[str, Any]], processes: list[dict[str, Any]]
) -> str:
    lines = [f"{key} = {toml_value(value)}" for key, value in top.items()]
    for name, tables in (("gpu", gpus), ("process", processes)):
        for table in tables:
            lines.append(f"[[{name}]]")
            lines += [f"{json.dumps(key)} = {toml_value(value)}" for key, value in table.items()]
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    """TOML for `value`: JSON's text is TOML's but for the names of the special floats."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def strict_json(text: str) -> None:
    """Raises `ValueError` for text that is not strict JSON (NaN and infinities are not)."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    json.loads(text, parse_constant=refuse)


def checks(path: Path) -> Iterator[tuple[str, str | None]]:
    """Per check of the scenario at `path`, its name and what went wrong (`None`: nothing)."""
    for name, args in (
        ("status --json", ["status", "--sim", str(path), "--json"]),
        ("status", ["status", "--sim", str(path)]),
        ("pick", ["pick", "--sim", str(path)]),
    ):
        code, out, err = run_gpuwatch(*args)
        if code not in ALLOWED_EXITS[args[0]] or "unexpected" in err:
            yield name, f"traceback: exit {code}: {err[:300]!r}"
        elif name == "status --json" and code == 0:
            try:
                strict_json(out)
            except ValueError as error:
                yield name, f"non-json: {error}"
    yield "daemon sampling", daemon_sampling(path)


def daemon_sampling(path: Path) -> str | None:
    """What the daemon serves of the scenario: its snapshot's JSON and its /metrics."""
    try:
        backend = open_backend("sim", str(path))
    except ScenarioError:
        return None  # the daemon refuses to start, with the same message as status
    try:
        with backend:
            snapshot = backend.sample()
        strict_json(json.dumps(snapshot.to_dict()))
        exposition(View(PollState(snapshot, None, time.monotonic(), 1, time.monotonic())))
    except ValueError as error:
        return f"non-json: {error}"
    except Exception as error:
        return f"traceback: {type(error).__name__}: {error}"
    return None


class Hang(BaseException):
    """A file's checks ran past HANG_S (a BaseException: no check may take it for its own)."""


def hung(signum: int, frame: object) -> None:
    raise Hang


def main(count: int) -> int:
    for name in ("GPUWATCH_BACKEND", "GPUWATCH_SIM", "CUDA_VISIBLE_DEVICES", "GPUWATCH_SOCKET"):
        os.environ.pop(name, None)
    figures: Counter[str] = Counter()
    examples: list[str] = []
    chance = random.Random(SEED)
    signal.signal(signal.SIGALRM, hung)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        os.environ["GPUWATCH_LEASE_DIR"] = str(Path(folder) / "leases")
        os.environ["GPUWATCH_SOCKET"] = str(Path(folder) / "no-daemon.sock")
        path = Path(folder) / "node.toml"
        for _ in range(count):
            text = spoilt_scenario(chance)
            path.write_bytes(text)
            try:
                open_backend("sim", str(path)).close()
                figures["loaded"] += 1
            except ScenarioError:
                figures["refused"] += 1
            signal.alarm(HANG_S)
            try:
                problems = [(name, problem) for name, problem in checks(path) if problem]
            except Hang:
                problems = [("all", f"hang: more than {HANG_S} s")]
            finally:
                signal.alarm(0)
            for name, problem in problems:
                figures[problem.split(":")[0]] += 1
                if len(examples) < 5:
                    examples.append(f"{name}: {problem[:300]}\n  file: {text[:200]!r}")
    print(f"scenario files:       {count}")
    print(f"  loaded:             {figures['loaded']}")
    print(f"  refused (exit 2):   {figures['refused']}")
    print(f"tracebacks:           {figures['traceback']}")
    print(f"non-JSON outputs:     {figures['non-json']}")
    print(f"hangs (> {HANG_S} s):        {figures['hang']}")
    print(f"(status, pick, the daemon's sampling on each; {time.monotonic() - started:.0f} s)")
    for example in examples:
        print(example)
    return 1 if figures["traceback"] or figures["non-json"] or figures["hang"] else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
