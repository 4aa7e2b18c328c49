"""The simulated backend: a node of GPUs for demos and tests, no driver needed.

What it reports is a pure function of the scenario and the wall-clock time, so
two processes looking at the same moment agree, and a test that fixes the clock
gets the same numbers every run. A scenario file is re-read when it changes,
so faults can be injected into a running client.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from gpuwatch.backends import sim_mig
from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.backends.mig_changes import MigChanges
from gpuwatch.backends.scenario import (
    Load,
    LoadShape,
    Scenario,
    SimGpu,
    SimProcess,
    default_scenario,
    load_scenario,
    parse_sim_spec,
)
from gpuwatch.errors import ScenarioError
from gpuwatch.models import GpuSample, MigDevice, ProcessUsage, Snapshot

log = logging.getLogger(__name__)

_IDLE_SM_CLOCK_MHZ = 345
_IDLE_PSTATE = 8
_NOISE_PCT = 3.0


class SimBackend(Backend):
    """Simulated GPUs: `SimBackend(4)` for four default GPUs, `SimBackend(Path(...))` for a
    file, `SimBackend(scenario)` for a `Scenario` built in code (a simulated fleet's nodes)."""

    name = "sim"

    @classmethod
    def from_spec(cls, spec: str, *, given: str | None = None) -> SimBackend:
        """The node `--sim SPEC` asks for: a GPU count or a scenario file (`given`: where
        the spec came from, for messages)."""
        return cls(parse_sim_spec(spec, given=given))

    def __init__(
        self, source: int | Path | Scenario, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._clock = clock
        self._path = source if isinstance(source, Path) else None
        if isinstance(source, Scenario):
            self._scenario = source
        elif isinstance(source, Path):
            self._scenario = load_scenario(source)
        else:
            self._scenario = default_scenario(source)
        self.simulation = _simulation_of(source)
        self._stamp = self._file_stamp()
        self._loaded_at = clock()
        self._mig_changes = MigChanges()

    @property
    def scenario(self) -> Scenario:
        """The scenario in force (the latest version of its file that parsed)."""
        return self._scenario

    def sample(self, scope: SampleScope = SampleScope.FULL) -> Snapshot:
        self._reload_if_changed()
        now = self._clock()
        scenario = self._scenario
        utilization = [
            _utilization(gpu.load, scenario.seed, i, now) for i, gpu in enumerate(scenario.gpus)
        ]
        sharing = Counter(p.gpu for p in scenario.processes)
        processes = tuple(
            self._process(p, scenario.gpus[p.gpu], utilization[p.gpu], sharing[p.gpu])
            for p in scenario.processes
            if scenario.gpus[p.gpu].fault is None
        )
        migs = tuple(
            device
            for i, gpu in enumerate(scenario.gpus)
            if gpu.mig and gpu.fault is None
            for device in sim_mig.mig_devices(i, gpu.uuid, gpu.model.name, gpu.mig, processes)
        )
        gpus = tuple(
            self._with_mig_changes(
                _gpu_sample(i, gpu, utilization[i], processes, now, scenario.seed), migs, now
            )
            for i, gpu in enumerate(scenario.gpus)
        )
        full = scope is SampleScope.FULL
        return Snapshot(
            taken_at=now,
            hostname=scenario.hostname,
            driver_version=scenario.driver_version,
            cuda_driver_version=scenario.cuda_driver_version,
            gpus=gpus,
            processes=processes if full else tuple(_bare(p) for p in processes),
            mig_devices=migs,
            simulated=True,
        )

    def close(self) -> None:
        pass

    def _with_mig_changes(
        self, gpu: GpuSample, migs: tuple[MigDevice, ...], now: float
    ) -> GpuSample:
        """The GPU, reporting MIG devices that vanished since the last sample (as NVML's does)."""
        if gpu.error is not None:
            return replace(gpu, error=self._mig_changes.lost_with(gpu.index, gpu.error))
        mine = [device for device in migs if device.gpu_index == gpu.index]
        notes = self._mig_changes.notes(gpu.index, mine, now)
        return replace(gpu, error="; ".join(notes)) if notes else gpu

    def _process(
        self, process: SimProcess, gpu: SimGpu, utilization_pct: float, sharing: int
    ) -> ProcessUsage:
        span = process.memory_high_bytes - process.memory_low_bytes
        memory = process.memory_low_bytes + int(span * utilization_pct / 100)
        return ProcessUsage(
            pid=process.pid,
            gpu_index=process.gpu,
            gpu_uuid=gpu.uuid,
            memory_used_bytes=memory,
            kind=process.kind,
            user=process.user,
            command=process.command,
            cpu_pct=round(5 + 0.9 * utilization_pct, 1),
            rss_bytes=(2 << 30) + memory // 16,
            started_at=self._loaded_at - 3600 * (1 + process.pid % 24),
            mig_uuid=None if process.mig is None else sim_mig.mig_uuid(gpu.uuid, process.mig),
            sm_util_pct=_sm_util(process, utilization_pct, sharing),
        )

    def _file_stamp(self) -> tuple[int, int, int] | None:
        if self._path is None:
            return None
        try:
            stat = os.stat(self._path)
        except OSError:
            return None
        return stat.st_ino, stat.st_size, stat.st_mtime_ns

    def _reload_if_changed(self) -> None:
        stamp = self._file_stamp()
        if self._path is None or stamp is None or stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self._scenario = load_scenario(self._path)
        except ScenarioError as error:
            log.warning("%s; keeping the previous scenario", error)


def _simulation_of(source: int | Path | Scenario) -> str:
    """The simulation's name (`Backend.simulation`): its GPU count, its scenario file (by
    name and by where it is: two files of one name are two simulations), or its host."""
    if isinstance(source, Path):
        digest = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:12]
        return f"{source.stem}-{digest}"
    if isinstance(source, Scenario):
        return f"node-{source.hostname}"
    return f"{source}-gpus"


def _sm_util(process: SimProcess, utilization_pct: float, sharing: int) -> int | None:
    """The scenario's figure, else an even share of the GPU's; none inside a MIG device,
    where drivers sample no process."""
    if process.mig is not None:
        return None
    if process.sm_util_pct is not None:
        return process.sm_util_pct
    return round(utilization_pct / max(1, sharing))


def _bare(process: ProcessUsage) -> ProcessUsage:
    """A process as the driver lists it, as in a `SampleScope.SELECTION` from NVML."""
    return ProcessUsage(
        process.pid,
        process.gpu_index,
        process.gpu_uuid,
        process.memory_used_bytes,
        process.kind,
        mig_uuid=process.mig_uuid,
    )


def _utilization(load: Load, seed: int, index: int, now: float) -> float:
    if load.shape is LoadShape.IDLE:
        return 0.0
    position = (now + load.phase_s) / load.period_s
    fraction = _shape_fraction(load.shape, position, seed, index)
    value = load.low_pct + (load.high_pct - load.low_pct) * fraction
    if load.shape is not LoadShape.CONSTANT:
        value += _noise(seed, index, math.floor(now)) * _NOISE_PCT
    return min(100.0, max(0.0, value))


def _shape_fraction(shape: LoadShape, position: float, seed: int, index: int) -> float:
    within = position % 1.0
    if shape is LoadShape.SINE:
        return (1 - math.cos(2 * math.pi * within)) / 2
    if shape is LoadShape.SQUARE:
        return 1.0 if within < 0.5 else 0.0
    if shape is LoadShape.RAMP:
        return within
    if shape is LoadShape.RANDOM:
        period = math.floor(position)
        start, end = (random.Random(f"{seed}:{index}:{k}").random() for k in (period, period + 1))
        return start + (end - start) * within
    return 1.0


def _noise(seed: int, index: int, second: int) -> float:
    """A value in [-1, 1] that changes once a second and is the same in every process."""
    return random.Random(f"{seed}:{index}:noise:{second}").uniform(-1.0, 1.0)


def _gpu_sample(
    index: int,
    gpu: SimGpu,
    utilization_pct: float,
    processes: tuple[ProcessUsage, ...],
    now: float,
    seed: int,
) -> GpuSample:
    model = gpu.model
    identity = GpuSample(
        index=index,
        uuid=gpu.uuid,
        name=model.name,
        pci_bus_id=gpu.pci_bus_id,
        minor_number=index if gpu.minor is None else gpu.minor,
    )
    if gpu.fault is not None:
        return replace(identity, error=gpu.fault)
    capacity = model.memory_total_bytes - model.memory_reserved_bytes
    used = min(capacity, sum(p.memory_used_bytes or 0 for p in processes if p.gpu_index == index))
    busy = utilization_pct > 0 or used > 0
    util = round(utilization_pct)
    metrics: dict[str, Any] = {
        "memory_total_bytes": model.memory_total_bytes,
        "memory_used_bytes": used,
        "memory_free_bytes": capacity - used,
        "memory_reserved_bytes": model.memory_reserved_bytes,
        "utilization_pct": util,
        "memory_utilization_pct": round(util * 0.6),
        "temperature_c": round(30 + 0.45 * util + _noise(seed, index, math.floor(now))),
        "power_w": round(
            model.idle_power_w + (0.92 * model.power_limit_w - model.idle_power_w) * util / 100, 1
        ),
        "power_limit_w": float(model.power_limit_w),
        "fan_pct": round(30 + 0.5 * util) if model.has_fan else None,
        "sm_clock_mhz": model.max_sm_clock_mhz if busy else _IDLE_SM_CLOCK_MHZ,
        "performance_state": 0 if busy else _IDLE_PSTATE,
    }
    for name in gpu.unsupported:
        metrics[name] = None
    if gpu.mig:  # as drivers: no utilization for a MIG-enabled GPU
        metrics.update(utilization_pct=None, memory_utilization_pct=None)
    return replace(identity, mig_enabled=bool(gpu.mig), **metrics)
