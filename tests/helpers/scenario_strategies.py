"""Random scenario files, for property tests.

Mostly the keys a scenario knows, with values of every type and size (NaN,
infinities, 400-digit numbers, negative counts, control and format
characters), sometimes an unknown key, deep nesting or bytes that are not text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

from hypothesis import strategies as st

from gpuwatch.backends import scenario
from gpuwatch.cli.exit_codes import ExitCode
from tests.helpers.cli import run_cli

_text = st.one_of(
    st.text(max_size=30),
    st.text(alphabet=st.sampled_from("\x1b\u202e\u2066\u200b\x9b[]0;m\n\"'\\ ab"), max_size=12),
)
_sizes = st.one_of(
    st.sampled_from(["1GiB", "24GiB", "80GiB", "500MB", "1.5G", "0"]),
    st.builds(lambda n: f"{n}MiB", st.integers(0, 90_000)),
)
_GOOD: dict[str, st.SearchStrategy[object]] = {
    "hostname": _text,
    "driver_version": _text,
    "cuda_driver_version": _text,
    "seed": st.integers(0, 1000),
    "model": st.sampled_from(["H100-80GB", "A100-40GB", "V100-32GB", "L4", "RTX-4090"]),
    "count": st.integers(1, 8),
    "name": _text,
    "uuid": st.builds(lambda n: f"GPU-{n:08x}", st.integers(0, 2**32 - 1)),
    "pci_bus_id": st.builds(lambda n: f"00000000:{n:02X}:00.0", st.integers(0, 255)),
    "memory_total": st.sampled_from(["24GiB", "80GiB", "40GiB", "1GiB"]),
    "memory_reserved": st.sampled_from(["0", "500MiB", "1GiB"]),
    "power_limit_w": st.floats(1, 10_000),
    "load": st.sampled_from(["idle", "constant", "sine", "square", "ramp", "random"]),
    "utilization_pct": st.one_of(
        st.integers(0, 100), st.lists(st.integers(0, 100), min_size=2, max_size=2).map(sorted)
    ),
    "period": st.sampled_from(["100ms", "1s", "30s", "24h"]),
    "unsupported": st.lists(st.sampled_from(["power_w", "fan_pct", "temperature_c"]), max_size=3),
    "fault": st.one_of(st.just("lost"), _text),
    "gpu": st.integers(0, 3),
    "pid": st.integers(1, 4_194_304),
    "user": _text,
    "command": _text,
    "memory": st.one_of(_sizes, st.lists(_sizes, min_size=2, max_size=2)),
    "kind": st.sampled_from(["compute", "graphics", "compute+graphics"]),
    "mig": st.one_of(  # most GPUs not in MIG mode: a process on one that is must name a device
        st.just([]),
        st.just([]),
        st.just([]),
        st.lists(st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb"]), min_size=1, max_size=3),
    ),
    "mig device": st.integers(0, 2),
}
# Values no key takes, or takes only within a range.
_NASTY: list[object] = [
    math.nan,
    math.inf,
    -math.inf,
    -1,
    0,
    65,
    1_000_000_000,
    4_194_305,
    2**63 - 1,
    -(2**63),
    True,
    [],
    "1" * 400 + "G",
    "9" * 400,
    "9999999999",
    "1025TiB",
    "-1G",
    "0.001s",
    "nan",
    "\u0663",
    "\u202e",
]
_BAD: st.SearchStrategy[object] = st.one_of(
    st.sampled_from(_NASTY),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    _text,
    st.lists(st.integers(), max_size=3),
)
_TOP_KEYS = ["hostname", "driver_version", "cuda_driver_version", "seed"]
# The keys the scenario reader knows, so the random files reach every one of its checks.
_GPU_KEYS = sorted(scenario._GPU_KEYS)
_PROCESS_KEYS = sorted(scenario._PROCESS_KEYS)


@st.composite
def _table(draw: st.DrawFn, keys: list[str], required: tuple[str, ...] = ()) -> dict[str, object]:
    chosen = [*required, *draw(st.lists(st.sampled_from(keys), unique=True, max_size=5))]
    if draw(_one_in(30)):
        chosen.append(draw(st.sampled_from(["colour", "gpu", "count "])))
    table = {}
    for key in chosen:
        name = "mig device" if key == "mig" and "pid" in keys else key
        bad = name not in _GOOD or draw(_one_in(8))
        table[key] = draw(_BAD if bad else _GOOD[name])
    if isinstance(table.get("count"), int) and table["count"] > 1 and not draw(_one_in(15)):
        table.pop("uuid", None)
        table.pop("pci_bus_id", None)
    return table


def _one_in(n: int) -> st.SearchStrategy[bool]:
    # Not `integers(0, n - 1) == 0`: Hypothesis draws the ends of a range far more often.
    return st.integers(0, n - 1).map(lambda drawn: drawn == n // 2)


@st.composite
def scenario_texts(draw: st.DrawFn) -> bytes:
    """The bytes of one scenario file: mostly one that loads, sometimes one value wrong."""
    kind = draw(st.integers(0, 39))
    if kind == 0:
        return draw(st.binary(max_size=200))
    if kind == 1:
        depth = draw(st.sampled_from([10, 100, 1000, 5000]))
        return f"a = {'[' * depth}{']' * depth}\n".encode()
    lines = [f"{key} = {_toml(value)}" for key, value in draw(_table(_TOP_KEYS)).items()]
    gpus = draw(st.lists(_table(_GPU_KEYS), min_size=1, max_size=4))
    for table in gpus:
        lines += ["[[gpu]]", *(f"{key} = {_toml(value)}" for key, value in table.items())]
    gpu_count = sum(t["count"] if isinstance(t.get("count"), int) else 1 for t in gpus)
    for table in draw(st.lists(_table(_PROCESS_KEYS, ("gpu", "pid")), max_size=4)):
        if isinstance(table["gpu"], int) and not isinstance(table["gpu"], bool):
            table["gpu"] = table["gpu"] % max(1, min(gpu_count, 64))
        lines += ["[[process]]", *(f"{key} = {_toml(value)}" for key, value in table.items())]
    return ("\n".join(lines) + "\n").encode()


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)  # inf and -inf are TOML too
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return _toml_string(str(value))


def _toml_string(text: str) -> str:
    escaped = "".join(
        f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F or c in '"\\' else c for c in text
    )
    return f'"{escaped}"'


def strict_json(text: str) -> object:
    """`json.loads` that refuses NaN and infinities, which are not JSON."""

    def refuse(name: str) -> object:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


# What each command may answer a scenario with; anything else (1: unexpected) is a crash.
ALLOWED_EXITS = {
    "status": {ExitCode.OK, ExitCode.USAGE},
    "pick": {ExitCode.OK, ExitCode.USAGE, ExitCode.NO_GPU, ExitCode.NOT_ENOUGH_GPUS},
}


def abuse(path: Path) -> Iterator[tuple[str, str | None]]:
    """Runs status (JSON and table), pick and the daemon's sampling on the scenario at `path`.

    Yields, per check, its name and what went wrong (`None`: nothing). A problem
    is `traceback: ...` (a crash, or an exit code the command never gives for a
    scenario) or `non-json: ...` (output that is not strict JSON).
    """
    for name, args in (
        ("status --json", ["status", "--sim", str(path), "--json"]),
        ("status", ["status", "--sim", str(path)]),
        ("pick", ["pick", "--sim", str(path)]),
    ):
        result = run_cli(*args)
        if result.exit_code not in ALLOWED_EXITS[args[0]] or "unexpected" in result.stderr:
            yield name, f"traceback: exit {result.exit_code}: {result.stderr[:300]!r}"
            continue
        if name == "status --json" and result.exit_code == ExitCode.OK:
            try:
                strict_json(result.stdout)
            except ValueError as error:
                yield name, f"non-json: {error}"
                continue
        yield name, None
    yield "daemon sampling", _daemon_sampling(path)


def _daemon_sampling(path: Path) -> str | None:
    from gpuwatch.backends import open_backend
    from gpuwatch.daemon.metrics import exposition
    from gpuwatch.daemon.view import View
    from gpuwatch.errors import ScenarioError
    from gpuwatch.sampling.poller import Poller

    try:
        poller = Poller(lambda: open_backend("sim", str(path)), 0.1, 10.0)
    except ScenarioError:
        return None  # the daemon refuses to start, with the same message as status
    try:
        poller._sample_once()  # one tick of the sampling thread, here and now
        snapshot = poller.state.snapshot
        exposition(View(poller.state))
        if snapshot is not None:
            strict_json(json.dumps(snapshot.to_dict()))
    except ValueError as error:
        return f"non-json: {error}"
    except Exception as error:
        return f"traceback: {type(error).__name__}: {error}"
    finally:
        poller.stop()
    return None
