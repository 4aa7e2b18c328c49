"""Leases across real processes: held while the holder lives, gone the moment it dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuwatch.errors import LeaseError
from gpuwatch.leases import LeaseDir, default_lease_dir
from gpuwatch.models import GpuSample
from gpuwatch.policy import Request

GPU = GpuSample(index=3, uuid="GPU-3", name="H100", pci_bus_id=None)

HOLDER = """
import sys, time
from pathlib import Path
from gpuwatch.leases import LeaseDir
from gpuwatch.models import GpuSample
lease_dir = LeaseDir(Path(sys.argv[1]))
with lease_dir.locked():
    lease_dir.claim(GpuSample(index=3, uuid="GPU-3", name="H100", pci_bus_id=None),
                    mem_bytes=None, command="holder")
print("held", flush=True)
time.sleep(60)
"""


def start_holder(path: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_claimed_lease_is_seen_with_who_holds_it(tmp_path: Path) -> None:
    lease_dir = LeaseDir(tmp_path)
    with lease_dir.locked():
        held = lease_dir.claim(GPU, mem_bytes=5, command="python train.py")
    (seen,) = LeaseDir(tmp_path).leases()
    assert seen == held.lease
    assert (seen.pid, seen.gpu_uuid, seen.command, seen.mem_bytes) == (
        os.getpid(),
        "GPU-3",
        "python train.py",
        5,
    )
    held.release()
    assert LeaseDir(tmp_path).leases() == []


def test_sigkilled_holder_frees_its_gpu_at_once(tmp_path: Path) -> None:
    holder = start_holder(tmp_path)
    assert [lease.pid for lease in LeaseDir(tmp_path).leases()] == [holder.pid]
    # WHEN the holder is killed outright
    holder.send_signal(signal.SIGKILL)
    holder.communicate()
    # THEN its lease is gone, and its file is cleaned up by the next locked look
    lease_dir = LeaseDir(tmp_path)
    with lease_dir.locked():
        assert lease_dir.leases() == []
    assert not list(tmp_path.glob("*.lease"))


def test_lease_passed_to_an_exec_child_lives_as_long_as_the_child(tmp_path: Path) -> None:
    code = f"""
import os, sys
from pathlib import Path
from gpuwatch.leases import LeaseDir
from gpuwatch.models import GpuSample
lease_dir = LeaseDir(Path({str(tmp_path)!r}))
with lease_dir.locked():
    held = lease_dir.claim(GpuSample(index=0, uuid="GPU-0", name=None, pci_bus_id=None),
                           mem_bytes=None, command="sleep")
held.pass_to_child()
os.execvp("sh", ["sh", "-c", "echo ready; exec sleep 60"])
"""
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    assert [lease.pid for lease in LeaseDir(tmp_path).leases()] == [child.pid]
    child.kill()
    child.communicate()
    assert LeaseDir(tmp_path).leases() == []


def test_waiting_line_is_in_arrival_order_and_forgets_the_dead(tmp_path: Path) -> None:
    lease_dir = LeaseDir(tmp_path)
    first = lease_dir.enqueue(Request(count=1), "first")
    time.sleep(0.001)
    second = lease_dir.enqueue(Request(count=2), "second")
    assert [w.request.count for w in lease_dir.waiting_before(second)] == [1]
    assert lease_dir.waiting_before(first) == []
    first.release()
    assert lease_dir.waiting_before(second) == []
    second.release()


@pytest.mark.parametrize(
    "junk",
    ["symlink", "fifo", "garbage", "not-a-dict", "huge"],
)
def test_junk_in_the_shared_directory_is_ignored(tmp_path: Path, junk: str) -> None:
    target = tmp_path / "00000000000000000001-1-x.lease"
    if junk == "symlink":
        (tmp_path / "elsewhere.json").write_text(json.dumps({"gpu_uuid": "GPU-3"}))
        target.symlink_to(tmp_path / "elsewhere.json")
    elif junk == "fifo":
        os.mkfifo(target)
    elif junk == "garbage":
        target.write_text("{not json")
    elif junk == "not-a-dict":
        target.write_text("[1, 2]")
    else:
        target.write_text(" " * (1 << 20))
    assert LeaseDir(tmp_path).leases() == []


def test_a_symlinked_lease_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(LeaseError, match="is not a directory"):
        LeaseDir(tmp_path / "link")


def test_a_world_writable_directory_must_be_sticky(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(LeaseError, match="not sticky"):
        LeaseDir(loose)


def test_a_new_directory_is_shared_and_sticky(tmp_path: Path) -> None:
    LeaseDir(tmp_path / "new")
    assert (tmp_path / "new").stat().st_mode & 0o7777 == 0o1777


def test_lease_dir_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUWATCH_LEASE_DIR", str(tmp_path))
    assert default_lease_dir() == str(tmp_path)


def test_unwritable_place_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LeaseError, match="GPUWATCH_LEASE_DIR"):
        LeaseDir(tmp_path / "missing" / "deeper")
