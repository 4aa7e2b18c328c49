"""Scenarios for the simulated node: parsed and checked, or built from a GPU count.

A scenario is a TOML file (its format: docs/reference/scenario.md). Everything here is
pure: text in, frozen `Scenario` out, or a `ScenarioError` naming the file, the entry and
what to write instead.
"""

from __future__ import annotations

import enum
import hashlib
from pathlib import Path
from typing import Any

import msgspec

from gpuwatch.backends import sim_mig
from gpuwatch.errors import InvalidValueError, ScenarioError
from gpuwatch.models import ProcessKind
from gpuwatch.record_fields import MAX_PID, REQUIRED, Table
from gpuwatch.tomlfile import read_toml
from gpuwatch.units import MAX_SIZE_BYTES, parse_duration, parse_size, parse_whole_number

MAX_GPUS = 64
MAX_PROCESSES = 4096
MAX_POWER_W = 10_000.0
MAX_SEED = (1 << 32) - 1
MIN_MEMORY_TOTAL_BYTES = 1 << 20
PERIOD_RANGE_S = (0.1, 86400.0)
# Metrics a scenario may declare unsupported (the GPU then reports None for them).
OPTIONAL_METRICS = frozenset(
    {
        "memory_reserved_bytes",
        "utilization_pct",
        "memory_utilization_pct",
        "temperature_c",
        "power_w",
        "power_limit_w",
        "fan_pct",
        "sm_clock_mhz",
        "performance_state",
    }
)


class LoadShape(enum.StrEnum):
    """How a simulated GPU's utilization moves over time."""

    IDLE = "idle"
    CONSTANT = "constant"
    SINE = "sine"
    SQUARE = "square"
    RAMP = "ramp"
    RANDOM = "random"


class Load(msgspec.Struct, frozen=True):
    """A utilization curve: `shape` between `low_pct` and `high_pct`, repeating every `period_s`."""

    shape: LoadShape
    low_pct: float = 0.0
    high_pct: float = 0.0
    period_s: float = 60.0
    phase_s: float = 0.0


class GpuModel(msgspec.Struct, frozen=True):
    """A product the simulator knows: what a fresh GPU of that kind reports."""

    name: str
    memory_total_bytes: int
    memory_reserved_bytes: int
    power_limit_w: float
    idle_power_w: float
    max_sm_clock_mhz: int
    has_fan: bool


_MIB = 1 << 20
MODELS = {
    "H100-80GB": GpuModel("NVIDIA H100 80GB HBM3", 81559 * _MIB, 579 * _MIB, 700, 69, 1980, False),
    "A100-80GB": GpuModel("NVIDIA A100-SXM4-80GB", 81920 * _MIB, 527 * _MIB, 400, 60, 1410, False),
    "A100-40GB": GpuModel("NVIDIA A100-SXM4-40GB", 40960 * _MIB, 423 * _MIB, 400, 55, 1410, False),
    "V100-32GB": GpuModel("Tesla V100-SXM2-32GB", 32768 * _MIB, 0, 300, 40, 1530, False),
    "L4": GpuModel("NVIDIA L4", 23034 * _MIB, 313 * _MIB, 72, 16, 2040, False),
    "RTX-4090": GpuModel("NVIDIA GeForce RTX 4090", 24564 * _MIB, 385 * _MIB, 450, 20, 2520, True),
}
DEFAULT_MODEL = "H100-80GB"
# A DGX H100's PCI layout; further GPUs continue at 0xE0.
_BUS_NUMBERS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


class SimGpu(msgspec.Struct, frozen=True):
    """One GPU of a scenario: its product, identity, load, and what it cannot report."""

    model: GpuModel
    uuid: str
    pci_bus_id: str
    load: Load
    unsupported: frozenset[str] = frozenset()
    fault: str | None = None
    mig: tuple[str, ...] = ()
    """The profiles of its MIG devices, when MIG-enabled (see `sim_mig`)."""
    minor: int | None = None
    """N of its device file `/dev/nvidiaN`; `None` for its index, as fakenvml does."""


class SimProcess(msgspec.Struct, frozen=True):
    """One process of a scenario on GPU `gpu`; its memory follows the GPU's utilization,
    from `memory_low_bytes` when idle to `memory_high_bytes` when fully busy."""

    gpu: int
    pid: int
    user: str
    command: str
    memory_low_bytes: int
    memory_high_bytes: int
    kind: ProcessKind = ProcessKind.COMPUTE
    mig: int | None = None
    """The index of the MIG device it runs in, on a MIG-enabled GPU."""
    sm_util_pct: int | None = None
    """Its SM utilization, fixed; unset, it takes an even share of its GPU's utilization."""


class Scenario(msgspec.Struct, frozen=True):
    """A simulated node: what its driver reports, its GPUs and the processes on them."""

    hostname: str
    driver_version: str
    cuda_driver_version: str
    seed: int
    gpus: tuple[SimGpu, ...]
    processes: tuple[SimProcess, ...]


def parse_sim_spec(spec: str, *, given: str | None = None) -> int | Path:
    """`--sim` takes a GPU count or the path of a scenario file. `given` says where the
    spec came from in messages (`GPUWATCH_SIM=abc`); `--sim SPEC` by default."""
    given = given or f"--sim {spec}"
    if spec.strip().isdigit():
        try:
            return parse_whole_number(spec, low=1, high=MAX_GPUS)
        except InvalidValueError:
            raise ScenarioError(f"{given}: a simulated node has 1 to {MAX_GPUS} GPUs") from None
    path = Path(spec)
    if not path.is_file():
        raise ScenarioError(
            f"{given}: neither a GPU count (1-{MAX_GPUS}) nor a scenario file that exists"
        )
    return path


def load_scenario(path: Path) -> Scenario:
    """Reads and checks a scenario file."""
    try:
        data = read_toml(path)
    except FileNotFoundError:
        raise ScenarioError(f"{path}: cannot read the scenario: no such file") from None
    except InvalidValueError as error:
        raise ScenarioError(f"{path}: {error}") from None
    try:
        return scenario_from_dict(data)
    except (InvalidValueError, ScenarioError) as error:
        raise ScenarioError(f"{path}: {error}") from error


def scenario_from_dict(data: dict[str, Any]) -> Scenario:
    top = _table(data, "scenario", _TOP_KEYS)
    seed = top.integer("seed", 0, low=0, high=MAX_SEED)
    gpus: list[SimGpu] = []
    for number, entry in enumerate(top.tables("gpu", limit=MAX_GPUS)):
        gpus.extend(_gpus(_table(entry, f"gpu[{number}]", _GPU_KEYS), seed, len(gpus)))
    if not gpus:
        raise ScenarioError(f"a scenario has 1 to {MAX_GPUS} GPUs ([[gpu]] tables), not 0")
    if len(uuids := {gpu.uuid for gpu in gpus}) < len(gpus):
        raise ScenarioError(f"two GPUs have the same uuid; uuids seen: {', '.join(sorted(uuids))}")
    minors = [index if gpu.minor is None else gpu.minor for index, gpu in enumerate(gpus)]
    if len(set(minors)) < len(minors):
        raise ScenarioError(f"two GPUs have the same minor number; minors: {minors}")
    processes = tuple(
        _process(_table(entry, f"process[{number}]", _PROCESS_KEYS), gpus)
        for number, entry in enumerate(top.tables("process", limit=MAX_PROCESSES))
    )
    return Scenario(
        hostname=_text(top, "hostname", "sim-node"),
        driver_version=_text(top, "driver_version", "580.95.05"),
        cuda_driver_version=_text(top, "cuda_driver_version", "13.0"),
        seed=seed,
        gpus=tuple(gpus),
        processes=processes,
    )


def default_scenario(gpu_count: int) -> Scenario:
    """`--sim N`: N H100s under the mix of work a shared node sees, moving over time."""
    gpus, processes = [], []
    for index in range(gpu_count):
        role = _ROLES[index % len(_ROLES)]
        gpus.append(_default_gpu(index, role.load, seed=0))
        for number, (user, command, memory_gib) in enumerate(role.processes):
            memory = int(memory_gib * (1 << 30))
            pid = 40_000 + 100 * index + number
            processes.append(SimProcess(index, pid, user, command, memory, memory))
    return Scenario("sim-node", "580.95.05", "13.0", 0, tuple(gpus), tuple(processes))


class _Role(msgspec.Struct, frozen=True):
    load: Load
    processes: tuple[tuple[str, str, float], ...]


_ROLES = (
    _Role(Load(LoadShape.SINE, 80, 100, 45), (("alice", "python train.py --rank 0", 61.5),)),
    _Role(
        Load(LoadShape.RANDOM, 15, 65, 20),
        (
            ("svc-infer", "tritonserver --model-repository /models", 18.0),
            ("svc-infer", "tritonserver --model-repository /models", 18.0),
        ),
    ),
    _Role(Load(LoadShape.SQUARE, 0, 35, 30), (("bob", "python -m ipykernel_launcher", 6.0),)),
    _Role(Load(LoadShape.IDLE), ()),
)
_GPU_KEYS = {
    "model",
    "count",
    "name",
    "uuid",
    "pci_bus_id",
    "memory_total",
    "memory_reserved",
    "power_limit_w",
    "load",
    "utilization_pct",
    "period",
    "unsupported",
    "fault",
    "mig",
    "minor",
}
_MAX_MINOR = 255  # the driver's minor numbers for GPUs; 255 is /dev/nvidiactl
_PROCESS_KEYS = {"gpu", "pid", "user", "command", "memory", "kind", "mig", "sm"}
_TOP_KEYS = {"hostname", "driver_version", "cuda_driver_version", "seed", "gpu", "process"}
_MAX_TEXT_CHARS = 4096
_MAX_LIST = 64
"""Far more than any list of a scenario holds (a GPU's MIG profiles, its unsupported
metrics): the checks after it say what fits."""


def _gpus(entry: Table, seed: int, first_index: int) -> list[SimGpu]:
    model_name = _text(entry, "model", DEFAULT_MODEL)
    if model_name not in MODELS:
        raise ScenarioError(
            f"{entry.where}.model: unknown model {model_name!r}; known: {', '.join(MODELS)}"
        )
    base = MODELS[model_name]
    total = _size_of(entry, "memory_total", base.memory_total_bytes, low=MIN_MEMORY_TOTAL_BYTES)
    power_limit_w = entry.number("power_limit_w", base.power_limit_w, low=1, high=MAX_POWER_W)
    model = GpuModel(
        name=_text(entry, "name", base.name),
        memory_total_bytes=total,
        memory_reserved_bytes=_size_of(
            entry, "memory_reserved", min(base.memory_reserved_bytes, total), high=total
        ),
        power_limit_w=power_limit_w,
        idle_power_w=min(base.idle_power_w, power_limit_w),
        max_sm_clock_mhz=base.max_sm_clock_mhz,
        has_fan=base.has_fan,
    )
    unsupported = frozenset(entry.strings("unsupported", limit=_MAX_LIST))
    if unknown := unsupported - OPTIONAL_METRICS:
        raise ScenarioError(
            f"{entry.where}.unsupported: {sorted(unknown)} are not optional "
            f"metrics; choose from {sorted(OPTIONAL_METRICS)}"
        )
    fault = _text(entry, "fault", "") or None
    load = _load(entry)
    # Checked before any GPU is made: a count of a billion must fail now, not after the RAM.
    count = entry.integer("count", 1, low=1, high=max(1, MAX_GPUS - first_index))
    if first_index + count > MAX_GPUS:
        raise ScenarioError(f"{entry.where}: a scenario has at most {MAX_GPUS} GPUs in all")
    if count > 1 and {"uuid", "pci_bus_id", "minor"} & entry.data.keys():
        raise ScenarioError(
            f"{entry.where}: a repeated GPU (count > 1) cannot set uuid, pci_bus_id or minor"
        )
    minor = entry.integer("minor", 0, low=0, high=_MAX_MINOR) if "minor" in entry.data else None
    gpus = []
    for index in range(first_index, first_index + count):
        made = _default_gpu(index, load, seed)
        gpus.append(
            SimGpu(
                model=model,
                uuid=_identifier(entry, "uuid", made.uuid, "GPU-"),
                pci_bus_id=_identifier(entry, "pci_bus_id", made.pci_bus_id, ""),
                load=load,
                unsupported=unsupported,
                fault="GPU is lost" if fault == "lost" else fault,
                mig=sim_mig.check_profiles(entry.where, entry.strings("mig", limit=_MAX_LIST)),
                minor=minor,
            )
        )
    return gpus


def _load(entry: Table) -> Load:
    try:
        shape = LoadShape(
            _text(entry, "load", "constant" if "utilization_pct" in entry.data else "idle")
        )
    except ValueError:
        raise ScenarioError(
            f"{entry.where}.load: choose one of {', '.join(shape.value for shape in LoadShape)}"
        ) from None
    low, high = _span(entry, "utilization_pct", (0.0, 0.0))
    if not 0 <= low <= high <= 100:
        raise ScenarioError(f"{entry.where}.utilization_pct: needs 0 <= low <= high <= 100")
    try:
        period_s = parse_duration(_text(entry, "period", "60s"))
    except InvalidValueError as error:
        raise ScenarioError(f"{entry.where}.period: {error}") from None
    shortest, longest = PERIOD_RANGE_S
    if not shortest <= period_s <= longest:
        raise ScenarioError(f"{entry.where}.period: give 100ms to 24h")
    return Load(shape, low, high, period_s)


def _process(entry: Table, gpus: list[SimGpu]) -> SimProcess:
    gpu = entry.integer("gpu", REQUIRED, low=-(1 << 63), high=1 << 63)  # range checked below
    if not 0 <= gpu < len(gpus):
        raise ScenarioError(f"{entry.where}.gpu: no GPU {gpu} (the scenario has {len(gpus)})")
    memory = entry.data.get("memory", "0")
    low, high = (memory, memory) if isinstance(memory, str) else _pair(entry, "memory", memory)
    low_bytes, high_bytes = _size(entry, "memory", low), _size(entry, "memory", high)
    if low_bytes > high_bytes:
        raise ScenarioError(f"{entry.where}.memory: write [low, high], the lower first")
    try:
        kind = ProcessKind(_text(entry, "kind", "compute"))
    except ValueError:
        raise ScenarioError(
            f"{entry.where}.kind: choose compute, graphics or compute+graphics"
        ) from None
    return SimProcess(
        gpu=gpu,
        pid=entry.integer("pid", REQUIRED, low=1, high=MAX_PID),
        user=_text(entry, "user", "root"),
        command=_text(entry, "command", "python"),
        memory_low_bytes=low_bytes,
        memory_high_bytes=high_bytes,
        kind=kind,
        mig=sim_mig.check_process_mig(entry.where, entry.data.get("mig"), gpus[gpu].mig),
        sm_util_pct=None if "sm" not in entry.data else entry.integer("sm", 0, low=0, high=100),
    )


def _default_gpu(index: int, load: Load, seed: int) -> SimGpu:
    digest = hashlib.sha1(f"gpuwatch-sim:{seed}:{index}".encode()).hexdigest()
    uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
    bus = _BUS_NUMBERS[index] if index < len(_BUS_NUMBERS) else 0xE0 + index
    # Phases differ per GPU so that GPUs with the same curve do not move in lockstep.
    phase = int(digest[32:36], 16) / 0xFFFF * load.period_s
    return SimGpu(
        model=MODELS[DEFAULT_MODEL],
        uuid=uuid,
        pci_bus_id=f"00000000:{bus:02X}:00.0",
        load=Load(load.shape, load.low_pct, load.high_pct, load.period_s, phase),
    )


def _identifier(entry: Table, key: str, default: str, prefix: str) -> str:
    """A uuid or bus id: it ends up in CUDA_VISIBLE_DEVICES, so no commas, spaces or escapes."""
    value = _text(entry, key, default)
    allowed = value.startswith(prefix) and 0 < len(value) <= 80
    if not (allowed and value.isascii() and all(c.isalnum() or c in "-:." for c in value)):
        shown = f'"{prefix}..." of ' if prefix else ""
        raise ScenarioError(
            f"{entry.where}.{key}: write {shown}letters, digits, '-', ':' and '.' only"
        )
    return value


def _size(entry: Table, key: str, value: object, low: int = 0, high: int = MAX_SIZE_BYTES) -> int:
    if not isinstance(value, str):
        raise ScenarioError(f'{entry.where}.{key}: write a size in quotes, e.g. "20GiB"')
    try:
        size = parse_size(value)
    except InvalidValueError as error:
        raise ScenarioError(f"{entry.where}.{key}: {error}") from None
    if not low <= size <= high:
        raise ScenarioError(
            f"{entry.where}.{key}: {value!r} is out of range: give {low:,} to {high:,} bytes"
        )
    return size


def _pair(entry: Table, key: str, value: object) -> tuple[Any, Any]:
    if not (isinstance(value, list | tuple) and len(value) == 2):
        raise ScenarioError(f"{entry.where}.{key}: give one value or a [low, high] pair")
    return value[0], value[1]


def _table(data: object, where: str, known: set[str]) -> Table:
    return Table(data, where, known, ScenarioError)


def _text(entry: Table, key: str, default: str) -> str:
    # A simulated process or GPU may carry any name, escapes included, as a real one may:
    # whoever displays it makes it printable.
    return entry.string(key, default, limit=_MAX_TEXT_CHARS, printable=False)


def _size_of(
    entry: Table, key: str, default: int, *, low: int = 0, high: int = MAX_SIZE_BYTES
) -> int:
    return _size(entry, key, entry.data[key], low, high) if key in entry.data else default


def _span(entry: Table, key: str, default: tuple[float, float]) -> tuple[float, float]:
    """One number, or a [low, high] pair of numbers."""
    if key not in entry.data:
        return default
    value = entry.data[key]
    low, high = (value, value) if isinstance(value, int | float) else _pair(entry, key, value)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high)):
        raise ScenarioError(
            f"{entry.where}.{key}: expected a number or [low, high], got {value!r:.40}"
        )
    return float(low), float(high)
