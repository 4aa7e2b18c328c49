"""The model's values are frozen records (msgspec Structs): each is shown, compared and
hashed by its fields, refuses to change, and survives copying, pickling and the JSON forms
it travels in."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import msgspec
import pytest

from gpuwatch.backends.scenario import Load, LoadShape
from gpuwatch.choices import Strategy
from gpuwatch.gpu_history import GpuSeries
from gpuwatch.jobs.job_table import Job
from gpuwatch.leases.directory import LeaseFiles
from gpuwatch.leases.records import request_from_record, request_record
from gpuwatch.models import GpuSample, Lease, MigDevice, Snapshot
from gpuwatch.placement.rules import Choice
from gpuwatch.request import Request, Waiter

LEASE = Lease("GPU-1", 0, 42, "alice", "python train.py", 1.5e9, mem_bytes=None, lease_id="x")
GPU = GpuSample(0, "GPU-1", "H100", "0000:18:00.0", memory_total_bytes=80 << 30, power_w=1.5)
MIG = MigDevice(0, 1, "MIG-1", profile="1g.10gb")
REQUEST = Request(count=2, strategy=Strategy.PACK, allowed=frozenset({1, 2}))
VALUES = [
    pytest.param(GPU, id="gpu-sample"),
    pytest.param(MIG, id="mig-device"),
    pytest.param(LEASE, id="lease"),
    pytest.param(Snapshot(1.0, "node", "580", "13.0", (GPU,), (), (MIG,)), id="snapshot"),
    pytest.param(GpuSeries(0, "GPU-1", [1.0], [None], [5], [40], [1.5]), id="series"),
    pytest.param(REQUEST, id="request"),
    pytest.param(Waiter(7, "bob", REQUEST, waited_s=2.0), id="waiter"),
    pytest.param(LeaseFiles([LEASE], skipped=1), id="lease-files"),
    pytest.param(Load(LoadShape.SINE, 10.0, 90.0, period_s=30.0), id="scenario-load"),
    pytest.param(Choice((GPU,), ("GPU 1: in use",), qualifying=1, free_bytes=(1,)), id="choice"),
    pytest.param(Job("4242", "alice", None, (4, 5), 1.5e9, 5400.0), id="job"),
]


def _fields(value: Any) -> list[str]:
    return [field.name for field in msgspec.structs.fields(value)]


@pytest.mark.parametrize("value", VALUES)
def test_repr_equality_and_hash_are_by_field(value: Any) -> None:
    # GIVEN a value of the model
    names = _fields(value)
    # THEN it is shown by its class and fields, as written
    shown = ", ".join(f"{name}={getattr(value, name)!r}" for name in names)
    assert repr(value) == f"{type(value).__name__}({shown})"
    # AND it equals a copy of itself, field for field, and hashes as its fields do
    same = msgspec.structs.replace(value)
    assert same == value
    assert same is not value
    if any(isinstance(getattr(value, name), list) for name in names):
        with pytest.raises(TypeError, match="unhashable"):
            hash(value)
    else:
        assert hash(same) == hash(value)


@pytest.mark.parametrize("value", VALUES)
def test_a_value_is_frozen_slotted_and_survives_copy_and_pickle(value: Any) -> None:
    name = _fields(value)[0]
    # WHEN a field is assigned or deleted THEN the value refuses
    with pytest.raises(AttributeError):
        setattr(value, name, None)
    with pytest.raises(AttributeError):
        delattr(value, name)
    # AND it has no __dict__ to grow new attributes in
    assert not hasattr(value, "__dict__")
    # AND copies and pickled copies are equal to it
    assert copy.deepcopy(value) == value
    assert pickle.loads(pickle.dumps(value)) == value


def test_values_differ_by_any_field_and_by_class() -> None:
    # GIVEN two leases that differ only in the declared memory
    shared = msgspec.structs.replace(LEASE, mem_bytes=1 << 30)
    # THEN they are not equal
    assert shared != LEASE
    # AND a value never equals one of another class with the same fields
    twin = msgspec.defstruct("Lease", [(name, Any) for name in _fields(LEASE)], frozen=True)
    assert twin(*(getattr(LEASE, name) for name in _fields(LEASE))) != LEASE
    assert GPU != (0, "GPU-1")


def test_a_snapshot_a_lease_and_a_request_still_round_trip_through_their_json() -> None:
    # GIVEN values as the daemon's wire, the lease directory and a waiting ticket carry them
    snapshot = Snapshot(1.0, "node", None, None, (GPU,), (), (MIG,))
    # WHEN written out and read back THEN they are what they were (every field, nested records too)
    assert Snapshot.from_dict(snapshot.to_dict()) == snapshot
    assert Lease(**LEASE.to_dict()) == LEASE
    assert request_from_record(request_record(REQUEST)) == REQUEST
