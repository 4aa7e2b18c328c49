"""Selecting MIG devices: the pure choice, `pick --mig`, `select(mig=...)`, presets and faults."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

import gpuwatch
from gpuwatch.backends.sim import SimBackend
from gpuwatch.choices import Strategy
from gpuwatch.errors import InvalidValueError
from gpuwatch.leases.directory import LeaseDir
from gpuwatch.leases.records import request_from_record, request_record
from gpuwatch.models import Lease, Snapshot
from gpuwatch.placement.gpus import choose
from gpuwatch.placement.mig import choose_mig, stale_mig_leases
from gpuwatch.request import Request, Waiter
from tests.helpers.cli import FROZEN_TIME, run_cli
from tests.helpers.mig import NODE, PICK
from tests.helpers.wait import wait_until

GIB = 1 << 30
_UNTIL = "while [ ! -e {go} ]; do sleep 0.05; done"
SEVEN = """
[[gpu]]
model = "A100-80GB"
mig = ["1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"]
"""


@pytest.fixture
def node(tmp_path: Path) -> Path:
    path = tmp_path / "mig-node.toml"
    path.write_text(NODE)
    return path


def snapshot_of(path: Path) -> Snapshot:
    return SimBackend(path, clock=lambda: FROZEN_TIME).sample()


def lease(snapshot: Snapshot, label: str, *, mem_bytes: int | None = None, pid: int = 1) -> Lease:
    device = next(m for m in snapshot.mig_devices if m.label == label)
    return Lease(str(device.uuid), device.gpu_index, pid, "bob", "job", 0.0, mem_bytes, f"L{pid}")


class TestChoice:
    def test_any_takes_the_free_device_and_says_why_not_the_busy_ones(self, node: Path) -> None:
        # GIVEN GPU 0's 3g.40gb and 2g.20gb run processes, its 1g.10gb runs none
        snapshot = snapshot_of(node)
        # WHEN any MIG device is asked for, exclusively
        choice = choose_mig(snapshot, Request(mig="any"))
        # THEN the idle one is chosen, and the others are in use
        assert [m.label for m in choice.chosen] == ["0:2"]
        assert choice.reasons == (
            "MIG 0:0 (3g.40gb): in use by root, pid 71001, 30.0GiB used",
            "MIG 0:1 (2g.20gb): in use by root, pid 72001, 14.0GiB used",
        )

    @pytest.mark.parametrize(
        ("request_", "chosen"),
        [
            (Request(mig="2g.20gb", mem_bytes=4 * GIB), ["0:1"]),
            (Request(mig="any", mem_bytes=4 * GIB), ["0:2"]),
            (Request(mig="any", mem_bytes=GIB, strategy=Strategy.PACK), ["0:1"]),
            (Request(mig="any", mem_bytes=GIB, min_free_bytes=10 * GIB), []),
            (Request(mig="any", mem_bytes=GIB, excluded=frozenset({0})), []),
        ],
        ids=["by-profile", "most-free-first", "pack-tightest", "none-has-the-memory", "excluded"],
    )
    def test_shared_requests_go_by_profile_and_memory(
        self, node: Path, request_: Request, chosen: list[str]
    ) -> None:
        choice = choose_mig(snapshot_of(node), request_)
        assert [m.label for m in choice.chosen] == chosen

    def test_a_leased_device_is_not_given_and_a_waiter_ahead_keeps_one(self, node: Path) -> None:
        # GIVEN the free 1g.10gb is leased, and a job waits ahead for any shared device
        snapshot = snapshot_of(node)
        held = [lease(snapshot, "0:2")]
        waiter = Waiter(9, "carol", Request(mig="2g.20gb", mem_bytes=GIB))
        # WHEN a shared request comes
        choice = choose_mig(
            snapshot, Request(mig="any", mem_bytes=GIB), leases=held, waiting_ahead=[waiter]
        )
        # THEN it gets what is neither leased nor kept
        assert [m.label for m in choice.chosen] == ["0:0"]
        assert "MIG 0:2 (1g.10gb): leased by pid 1 (bob)" in choice.reasons
        assert "MIG 0:1 (2g.20gb): kept for pid 9 (carol), which asked earlier" in choice.reasons

    def test_a_waiter_for_more_devices_of_a_profile_than_exist_keeps_none(self, node: Path) -> None:
        # GIVEN a job waiting ahead for two 3g.40gb devices, of which the node has one
        snapshot = snapshot_of(node)
        waiter = Waiter(9, "carol", Request(count=2, mig="3g.40gb", mem_bytes=GIB))
        # WHEN a job asks for that one THEN it gets it: the waiter can never be served
        choice = choose_mig(snapshot, Request(mig="3g.40gb", mem_bytes=GIB), waiting_ahead=[waiter])
        assert [m.label for m in choice.chosen] == ["0:0"]

    def test_memory_promised_to_shared_leases_is_named_as_for_whole_gpus(self, node: Path) -> None:
        # GIVEN the idle 1g.10gb (9.8 GiB free) shared with a job that declared 6 GiB and
        # allocated none yet
        snapshot = snapshot_of(node)
        held = [lease(snapshot, "0:2", mem_bytes=6 * GIB, pid=4242)]
        # WHEN another shared job wants 8 GiB there
        choice = choose_mig(snapshot, Request(mig="1g.10gb", mem_bytes=8 * GIB), leases=held)
        # THEN it is refused, saying the promise is what leaves too little
        assert not choice.satisfied
        assert (
            "MIG 0:2 (1g.10gb): 3.8GiB free after 6.0GiB promised to shared leases < 8.0GiB"
            in choice.reasons
        )

    def test_a_device_leased_to_the_job_alone_counts_what_runs_there_as_its_own(
        self, node: Path
    ) -> None:
        # GIVEN the job holds the busy 2g.20gb exclusively, and its process there runs in
        # another PID namespace (a pid this side cannot tell)
        snapshot = snapshot_of(node)
        mine = lease(snapshot, "0:1", pid=5555)
        # WHEN that job asks again (a nested pick) for the device it holds
        choice = choose_mig(
            snapshot, Request(mig="2g.20gb"), leases=[mine], mine=frozenset({mine.lease_id})
        )
        # THEN it gets it: the process there can only be its own, as on a whole GPU
        assert [m.label for m in choice.chosen] == ["0:1"]

    def test_a_mig_enabled_gpu_is_never_chosen_whole(self, node: Path) -> None:
        # GIVEN GPU 0 in MIG mode, with a free MIG device, and GPU 1 excluded
        choice = choose(snapshot_of(node), Request(count=1, excluded=frozenset({1})))
        # THEN GPU 0 is not handed out whole
        assert not choice.satisfied
        assert choice.reasons[0] == (
            "GPU 0: MIG enabled: it is given out only as MIG devices (use --mig PROFILE|any)"
        )

    def test_leases_of_vanished_devices_are_stale(self, node: Path, tmp_path: Path) -> None:
        # GIVEN leases on two MIG devices of GPU 0
        before = snapshot_of(node)
        leases = [lease(before, "0:1", pid=1), lease(before, "0:2", pid=2)]
        # WHEN GPU 0 is reconfigured: its 1g.10gb is destroyed
        node.write_text(NODE.replace(', "1g.10gb"]', "]"))
        after = snapshot_of(node)
        # THEN only the lease of the vanished device is stale
        assert stale_mig_leases(after, leases) == [leases[1]]
        # AND a lease taken after the snapshot is not judged by it (the device may be new)
        newer = msgspec.structs.replace(leases[1], started_at=after.taken_at + 1)
        assert stale_mig_leases(after, [newer]) == []

    def test_a_request_for_mig_devices_survives_a_waiting_ticket(self) -> None:
        request = Request(
            mig="1g.10gb", mig_allowed=frozenset({"MIG-a"}), mig_excluded=frozenset({"MIG-b"})
        )
        assert request_from_record(request_record(request)) == request

    @pytest.mark.parametrize(
        "field",
        [{"mig": 7}, {"mig": "x" * 500}, {"mig_allowed": ["GPU-1"]}, {"mig_excluded": "MIG-a"}],
        ids=["number", "too-long", "not-mig", "not-a-list"],
    )
    def test_a_forged_ticket_is_refused(self, field: dict[str, object]) -> None:
        with pytest.raises(ValueError, match="not a"):
            request_from_record({"count": 1, **field})


class TestPick:
    def test_pick_mig_prints_a_mig_uuid(self, node: Path) -> None:
        snapshot = snapshot_of(node)
        result = run_cli("pick", "--sim", str(node), "--mig", "1g.10gb")
        assert result.exit_code == 0, result.stderr
        assert result.stdout == f"{snapshot.mig_devices[2].uuid}\n"
        assert "chose MIG device 0:2 1g.10gb" in result.stderr

    def test_a_node_with_only_mig_devices_free_says_so(self, node: Path) -> None:
        # GIVEN GPU 1 is full and GPU 0 is in MIG mode with one idle device
        # WHEN a whole GPU with 20 GiB free is asked for
        result = run_cli("pick", "--sim", str(node), "--min-free", "20GiB")
        # THEN none qualifies, GPU 0 says why, and the message points to --mig
        assert result.exit_code == 4
        assert "1 MIG device is free: use --mig PROFILE|any" in result.stderr
        assert "GPU 0: MIG enabled" in result.stderr

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--mig", "big"], "give a MIG profile such as 1g.10gb"),
            (["--mig", "7g.80gb"], "there are: 1g.10gb, 2g.20gb, 3g.40gb"),
            (["--mig", "any", "--max-util", "50"], "MIG devices report no utilization"),
            (["--mig", "any", "-n", "4"], "4 MIG devices asked for, but there are 3"),
            (
                ["--mig", "any", "--exclude", "0"],
                "1 MIG device asked for, but there are 0 to choose from",
            ),
            (
                ["--mig", "any", "-n", "2", "--", "true"],
                "CUDA gives a process only one MIG device",
            ),
        ],
        ids=[
            "bad-profile",
            "absent-profile",
            "max-util",
            "too-many",
            "one-all-excluded",
            "two-for-one-command",
        ],
    )
    def test_what_cannot_work_is_refused_with_exit_code_2(
        self, node: Path, args: list[str], message: str
    ) -> None:
        result = run_cli("pick", "--sim", str(node), *args)
        assert result.exit_code == 2
        assert message in result.stderr
        assert "Traceback" not in result.stderr

    def test_two_devices_print_for_a_launcher(self, node: Path) -> None:
        # WHEN two shared devices are asked for without a command (a launcher hands them out)
        result = run_cli("pick", "--sim", str(node), "--mig", "any", "-n", "2", "--mem", "1GiB")
        # THEN both MIG UUIDs are printed, best first
        assert result.exit_code == 0, result.stderr
        assert [uuid[:4] for uuid in result.stdout.strip().split(",")] == ["MIG-", "MIG-"]

    @pytest.mark.parametrize("explicit", [False, True], ids=["implied", "with-mig-any"])
    def test_a_preset_of_mig_uuids_is_the_set_to_choose_from(
        self, node: Path, explicit: bool
    ) -> None:
        # GIVEN Slurm handed this job two MIG devices, one of them busy
        migs = snapshot_of(node).mig_devices
        preset = f"{migs[1].uuid},{migs[2].uuid}"
        args = ["--mig", "any"] if explicit else []
        # WHEN the job picks, with or without --mig
        result = run_cli("pick", "--sim", str(node), *args, env={"CUDA_VISIBLE_DEVICES": preset})
        # THEN it gets the free one of the two
        assert result.exit_code == 0, result.stderr
        assert result.stdout == f"{migs[2].uuid}\n"

    def test_a_preset_in_the_pre_r470_form_is_understood(self, node: Path) -> None:
        snapshot = snapshot_of(node)
        gpu, mig = snapshot.gpus[0], snapshot.mig_devices[2]
        old_form = f"MIG-{gpu.uuid}/{mig.gpu_instance_id}/{mig.compute_instance_id}"
        result = run_cli("pick", "--sim", str(node), env={"CUDA_VISIBLE_DEVICES": old_form})
        assert result.stdout == f"{mig.uuid}\n"


class TestSelect:
    @pytest.fixture(autouse=True)
    def _clean(self) -> Iterator[None]:
        yield
        if (selection := gpuwatch.placement.selection._this_process.selection) is not None:
            selection.release()
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)

    def test_select_mig_leases_a_device_and_sets_its_uuid(self, node: Path) -> None:
        selection = gpuwatch.select(mig="any", sim=str(node))
        mig = snapshot_of(node).mig_devices[2]
        assert os.environ["CUDA_VISIBLE_DEVICES"] == mig.uuid
        assert (selection.uuids, selection.indices, len(selection)) == ([mig.uuid], [0], 1)
        assert [held.lease.gpu_uuid for held in selection.leases] == [mig.uuid]
        # AND another job (not one this process starts) is refused it while it is held
        other = run_cli("pick", "--sim", str(node), "--mig", "1g.10gb", env={"GPUWATCH_HELD": None})
        assert other.exit_code == 4

    def test_select_refuses_two_mig_devices_for_one_process(self, node: Path) -> None:
        with pytest.raises(InvalidValueError, match="only one MIG device"):
            gpuwatch.select(2, mig="any", sim=str(node))

    @pytest.mark.parametrize(
        ("arguments", "message"),
        [
            (
                {"mig": "4g.40gb"},
                r"^mig='4g.40gb': no MIG device of that profile .* \(or use mig='any'\)$",
            ),
            ({"mig": "any", "max_util": 10}, r"^max_util: MIG devices report no utilization"),
        ],
        ids=["unknown-profile", "max-util"],
    )
    def test_select_speaks_of_its_own_arguments_not_picks_options(
        self, node: Path, arguments: dict[str, object], message: str
    ) -> None:
        # GIVEN a MIG request select() cannot meet WHEN it is made THEN the error names the
        # argument as the caller wrote it (pick says --mig and --max-util for the same)
        with pytest.raises(InvalidValueError, match=message):
            gpuwatch.select(sim=str(node), **arguments)  # type: ignore[arg-type]


@pytest.mark.slow
def test_concurrent_picks_get_distinct_mig_devices(tmp_path: Path) -> None:
    # GIVEN 8 jobs started at once on a GPU with 7 free MIG devices, each holding its own
    scenario, go = tmp_path / "seven.toml", tmp_path / "go"
    scenario.write_text(SEVEN)
    notes = [tmp_path / f"job{n}" for n in range(8)]
    script = 'echo "$CUDA_VISIBLE_DEVICES" > {note}; ' + _UNTIL
    env = {**os.environ, "GPUWATCH_SIM": str(scenario)}
    jobs = [
        subprocess.Popen(
            [*PICK, "--mig", "any", "--", "sh", "-c", script.format(note=note, go=go)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for note in notes
    ]
    try:
        wait_until(
            lambda: sum(n.exists() for n in notes) + sum(j.poll() is not None for j in jobs) >= 8,
            "every job to hold a device or be refused",
            timeout_s=120,
            interval_s=0.02,
        )
        refused = [job for job in jobs if job.poll() is not None]
    finally:
        go.touch()
        for job in jobs:
            job.communicate(timeout=60)
    # THEN 7 hold 7 different MIG devices, and 1 is refused with exit code 4
    held = [note.read_text().strip() for note in notes if note.exists()]
    assert len(held) == len(set(held)) == 7 and all(uuid.startswith("MIG-") for uuid in held)
    assert [job.returncode for job in refused] == [4]


def test_a_lease_on_a_device_that_vanished_is_released(node: Path, tmp_path: Path) -> None:
    # GIVEN a job holds the 1g.10gb MIG device
    go = tmp_path / "go"
    holder = subprocess.Popen(
        [*PICK, "--mig", "1g.10gb", "--", "sh", "-c", f"echo held; {_UNTIL.format(go=go)}"],
        env={**os.environ, "GPUWATCH_SIM": str(node)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert len(LeaseDir().leases()) == 1
        # WHEN GPU 0 is reconfigured, its 1g.10gb destroyed, and another job picks
        node.write_text(NODE.replace(', "1g.10gb"]', "]"))
        result = run_cli("pick", "--sim", str(node), "--mig", "any", "--mem", "1GiB")
        # THEN the stale lease is gone, and the pick is served
        assert result.exit_code == 0, result.stderr
        assert LeaseDir().leases() == []
    finally:
        go.touch()
        holder.communicate(timeout=60)


class TestImpossibleMigRequests:
    def test_more_devices_of_a_profile_than_exist_is_refused_before_waiting(
        self, node: Path, lease_dir: Path
    ) -> None:
        # GIVEN one 3g.40gb device (and two of other profiles)
        # WHEN two 3g.40gb devices are asked for, waiting
        result = run_cli("pick", "--sim", str(node), "--mig", "3g.40gb", "-n", "2", "--wait")
        # THEN it is refused at once as bad usage, and no ticket is left to hold the device
        assert result.exit_code == 2, result.stderr
        assert "2 MIG devices asked for, but there is 1 of profile 3g.40gb" in result.stderr
        assert list(lease_dir.glob("*.wait")) == []

    def test_mig_on_a_node_without_mig_is_not_enough_gpus(self) -> None:
        result = run_cli("pick", "--sim", "2", "--mig", "any")
        assert result.exit_code == 4, result.stderr
        assert "--mig any: no GPU on this machine has MIG devices" in result.stderr
        assert "  GPU 0: MIG not enabled" in result.stderr
