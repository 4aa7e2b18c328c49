"""Exporters' series to nodes: what each exporter tells lands in the model, what it does not
stays None, and nothing a node sends can pass for a reading it is not."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from gpuwatch.fleet.exposition import Sample, parse_exposition
from gpuwatch.fleet.names import node_text
from gpuwatch.fleet.series import PREFIXES, claimed, target_state
from gpuwatch.fleet_model import Exporter, NodeState
from tests.helpers.fleet.servers import fixture

GIB = 1 << 30
MIB = 1 << 20
GPUWATCH_TAKEN_AT = 1.7954727494912333e09
SMI_COLLECTED_AT = 1.751475457e09


def state(name: str, *, now: float = GPUWATCH_TAKEN_AT + 1, stale_after_s: float = 15) -> NodeState:
    samples = list(parse_exposition(fixture(name).decode(), PREFIXES))
    return target_state(
        samples, fallback_name="10.0.0.9", seen_at=now, now=now, stale_after_s=stale_after_s
    )


def test_a_gpuwatch_daemon_tells_every_gpu_its_leases_and_mig_devices() -> None:
    # GIVEN a daemon's /metrics: GPU 0 leased exclusively, GPU 1 shared by two leases,
    # GPU 2 MIG-enabled, GPU 3 lost
    # WHEN it is read
    node = state("gpuwatch_node.prom")
    # THEN the node is named by its hostname label, up, with its data's age
    assert (node.name, node.up, node.exporter) == ("gpu-node-07", True, Exporter.GPUWATCH)
    assert node.age_at(GPUWATCH_TAKEN_AT + 1) == pytest.approx(1.0)
    assert node.snapshot is not None
    gpus = node.snapshot.gpus
    assert [gpu.index for gpu in gpus] == [0, 1, 2, 3]
    assert gpus[0].uuid == "GPU-371387c3-427e-a5a0-e9d6-04b4dd1c1911"
    assert gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert gpus[1].memory_used_bytes == 30 * GIB
    assert gpus[1].utilization_pct == 35
    assert gpus[2].mig_enabled is True and gpus[0].mig_enabled is False
    # AND the lost GPU is down, with no reading passed off as current
    assert gpus[3].error is not None and gpus[3].memory_free_bytes is None
    assert node.snapshot.driver_version == "580.95.05"


def test_gpuwatch_leases_become_leases_the_placement_rules_can_count() -> None:
    node = state("gpuwatch_node.prom")
    assert node.leases is not None
    by_gpu = {(lease.gpu_index, lease.exclusive) for lease in node.leases}
    assert by_gpu == {(0, True), (1, False), (2, True)}
    shared = [lease for lease in node.leases if lease.gpu_index == 1]
    # The declared memory is split between the shared leases, summing to what was declared.
    assert len(shared) == 2
    assert sum(lease.mem_bytes or 0 for lease in shared) == 32 * GIB + 1
    mig_lease = next(lease for lease in node.leases if lease.gpu_index == 2)
    assert mig_lease.gpu_uuid == "MIG-8a1b45fb-4dd6-a721-2aa3-cd0a672dafe2"
    assert len({lease.lease_id for lease in node.leases}) == len(node.leases)


def test_gpuwatch_mig_devices_and_processes_with_their_users() -> None:
    node = state("gpuwatch_node.prom")
    assert node.snapshot is not None
    migs = node.snapshot.mig_devices
    assert [(m.gpu_index, m.index, m.profile) for m in migs] == [
        (2, 0, "3g.40gb"),
        (2, 1, "1g.10gb"),
    ]
    assert migs[0].memory_used_bytes == 12 * GIB
    users = {(p.user, p.gpu_index) for p in node.snapshot.processes}
    assert ("alice", 1) in users


def test_a_daemon_snapshot_older_than_the_limit_is_stale_not_current() -> None:
    node = state("gpuwatch_node.prom", now=GPUWATCH_TAKEN_AT + 60, stale_after_s=15)
    assert node.up is False
    assert node.age_at(GPUWATCH_TAKEN_AT + 60) == pytest.approx(60)
    assert node.error is not None and "stale" in node.error
    # Its GPUs are still shown, as they were: the screen marks them with the age.
    assert node.snapshot is not None and len(node.snapshot.gpus) == 4


def test_dcgm_exporter_memory_in_mib_total_where_dcgm_defines_it() -> None:
    node = state("dcgm_node.prom")
    assert (node.name, node.up, node.exporter) == ("dgx-a100-03", True, Exporter.DCGM)
    assert node.leases is None  # dcgm-exporter cannot tell leases: unknown, not none
    assert node.snapshot is not None
    gpu = node.snapshot.gpus[0]
    assert gpu.uuid == "GPU-5fa3c2b0-8d61-4b1e-9b0e-0c7b6a1e2f01"
    assert gpu.memory_free_bytes == 20480 * MIB
    assert gpu.memory_used_bytes == 60437 * MIB
    assert gpu.memory_total_bytes == (20480 + 60437 + 633) * MIB
    assert (gpu.utilization_pct, gpu.temperature_c, gpu.power_w) == (87, 61, 312.482)
    assert gpu.mig_enabled is None  # no MIG series and no MIG mode counter: unknown


def test_dcgm_mig_instances_are_mig_devices_of_a_mig_enabled_gpu() -> None:
    node = state("dcgm_node.prom")
    assert node.snapshot is not None
    gpu = node.snapshot.gpus[1]
    assert gpu.mig_enabled is True
    assert gpu.memory_free_bytes is None  # DCGM reports its memory per instance only
    migs = node.snapshot.mig_devices
    assert [(m.profile, m.gpu_instance_id, m.memory_free_bytes) for m in migs] == [
        ("3g.40gb", 1, 28337 * MIB),
        ("1g.10gb", 9, 9984 * MIB),
    ]


def test_an_old_dcgm_exporter_without_reserved_memory_leaves_the_total_unknown() -> None:
    node = state("dcgm_old.prom")
    assert node.name == "v100-node"
    assert node.snapshot is not None
    gpu = node.snapshot.gpus[0]
    assert gpu.memory_free_bytes == 32197 * MIB
    assert gpu.memory_total_bytes is None


def test_nvidia_gpu_exporter_joined_on_uuid_named_by_instance() -> None:
    node = state("nvidia_smi_node.prom", now=SMI_COLLECTED_AT + 2)
    # No hostname label: the node is named by where it was read.
    assert (node.name, node.up, node.exporter) == ("10.0.0.9", True, Exporter.NVIDIA_GPU_EXPORTER)
    assert node.leases is None
    assert node.snapshot is not None
    busy, idle = node.snapshot.gpus
    assert busy.uuid == "GPU-3c1e0a55-7d2b-4e8a-9f10-aa01bb02cc03"
    assert (busy.index, busy.pci_bus_id) == (0, "00000000:17:00.0")
    assert busy.memory_total_bytes == 85520809984
    assert busy.memory_free_bytes == 64238911488
    assert (busy.utilization_pct, idle.utilization_pct) == (100, 3)
    assert (busy.temperature_c, busy.power_w, busy.mig_enabled) == (59, 631.95, False)
    assert [p.pid for p in node.snapshot.processes] == [11345]
    assert node.snapshot.processes[0].user is None
    # Its own collection time dates the data.
    assert node.age_at(SMI_COLLECTED_AT + 2) == pytest.approx(2)


def sample(name: str, value: float, **labels: str) -> Sample:
    return Sample(name, labels, value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(-1.0, None), (2e18, None), (1024.0, 1024)],
    ids=["negative", "beyond-1024TiB", "plain"],
)
def test_a_memory_value_out_of_range_is_unknown_not_trusted(value: float, expected: int) -> None:
    labels = {"gpu": "0", "uuid": "GPU-1", "hostname": "n"}
    samples = [
        sample("gpuwatch_sample_timestamp_seconds", 100.0, hostname="n"),
        sample("gpuwatch_gpu_info", 1, **labels),
        sample("gpuwatch_memory_free_bytes", value, **labels),
    ]
    node = target_state(samples, fallback_name="x", seen_at=100, now=100, stale_after_s=15)
    assert node.snapshot is not None
    assert node.snapshot.gpus[0].memory_free_bytes == expected


@pytest.mark.parametrize(
    ("hostname", "shown"),
    [
        ("evil\x1b[2Jnode", "evil\\x1b[2Jnode"),
        ("tab\there", "tab\\x09here"),
        ("back\\slash\n", "back\\\\slash\\x0a"),
        ("gpu 07", "gpu\\x2007"),
        ("gpu\u00a007", "gpu\\xa007"),
        ("-oProxyCommand=x", "\\x2doProxyCommand=x"),
        ("ok-node.lab", "ok-node.lab"),
    ],
    ids=["escape-sequence", "tab", "backslash-newline", "space", "nbsp", "dash", "plain"],
)
def test_a_node_name_with_control_characters_or_whitespace_is_escaped(
    hostname: str, shown: str
) -> None:
    # GIVEN a node naming itself with what a terminal acts on, what splits a shell word,
    # or what a command takes for an option
    samples = [
        sample("gpuwatch_sample_timestamp_seconds", 100.0, hostname=hostname),
        sample("gpuwatch_gpu_info", 1, gpu="0", uuid="GPU-1", hostname=hostname),
    ]
    # WHEN it is read
    node = target_state(samples, fallback_name="x", seen_at=100, now=100, stale_after_s=15)
    # THEN its name is escaped: printable, one word, never an option
    assert node.name == shown == node_text(hostname)
    assert node.name.isprintable() and node.name.split()[0] == node.name
    assert not node.name.startswith("-")


def test_a_daemon_whose_sampling_stalled_is_down_with_why() -> None:
    samples = [
        sample("gpuwatch_sampling_up", 0),
        sample("gpuwatch_sample_timestamp_seconds", 100.0, hostname="n"),
        sample("gpuwatch_gpu_up", 0, gpu="0", uuid="GPU-1", hostname="n"),
    ]
    node = target_state(samples, fallback_name="x", seen_at=101, now=101, stale_after_s=15)
    assert node.up is False
    assert node.error is not None and "sampling" in node.error


def test_gpuwatch_series_win_over_dcgm_in_one_targets_answer() -> None:
    # GIVEN one /metrics page with both gpuwatch's and dcgm-exporter's series
    dcgm = list(parse_exposition(fixture("dcgm_node.prom").decode(), PREFIXES))
    gpuwatch = list(parse_exposition(fixture("gpuwatch_node.prom").decode(), PREFIXES))
    now = GPUWATCH_TAKEN_AT + 1
    # WHEN it is read, in either order
    for samples in ([*dcgm, *gpuwatch], [*gpuwatch, *dcgm]):
        node = target_state(samples, fallback_name="x", seen_at=now, now=now, stale_after_s=15)
        # THEN it is gpuwatch's node
        assert node.exporter is Exporter.GPUWATCH


def test_two_targets_that_claim_one_name_are_two_nodes_both_marked() -> None:
    # GIVEN dcgm-exporter and a gpuwatch daemon whose series both name `dgx-a100-03`
    dcgm = replace(state("dcgm_node.prom"), target="10.0.0.3:9400")
    gpuwatch_samples = list(parse_exposition(fixture("gpuwatch_node.prom").decode(), PREFIXES))
    renamed = [
        Sample(
            s.name,
            {**s.labels, "hostname": "dgx-a100-03"} if "hostname" in s.labels else s.labels,
            s.value,
        )
        for s in gpuwatch_samples
    ]
    now = GPUWATCH_TAKEN_AT + 1
    gpuwatch = target_state(
        renamed, fallback_name="x", seen_at=now, now=now, stale_after_s=15, target="10.0.0.3:19400"
    )
    # WHEN the fleet's nodes are told who claims each name
    nodes = claimed([gpuwatch, dcgm])
    # THEN both are nodes, each marked and labelled by its target
    assert [(n.name, n.claims, n.label, n.exporter) for n in nodes] == [
        ("dgx-a100-03", 2, "dgx-a100-03@10.0.0.3:19400", Exporter.GPUWATCH),
        ("dgx-a100-03", 2, "dgx-a100-03@10.0.0.3:9400", Exporter.DCGM),
    ]


def test_an_exposition_with_broken_lines_yields_the_good_ones() -> None:
    text = "\n".join(
        [
            'gpuwatch_gpu_up{gpu="0",uuid="a\\"b"} 1',
            'gpuwatch_gpu_up{gpu="1" 1',
            'gpuwatch_gpu_up{gpu="2"} NaN',
            'gpuwatch_gpu_up{gpu="3"} not-a-number',
            "gpuwatch_sampling_up 1 1700000000000",
            "<html><body>gpuwatch_</body></html>",
        ]
    )
    samples = list(parse_exposition(text, PREFIXES))
    assert [(s.name, s.labels, s.value) for s in samples] == [
        ("gpuwatch_gpu_up", {"gpu": "0", "uuid": 'a"b'}, 1.0),
        ("gpuwatch_sampling_up", {}, 1.0),
    ]
