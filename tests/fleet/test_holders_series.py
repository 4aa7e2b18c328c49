"""Who holds each device, read from an exporter's series (`NodeState.holders`): a gpuwatch
daemon's jobs, pods and unknowns, dcgm-exporter's pod labels. Whatever cannot be believed
makes its device unknown, never free; a MIG device of a GPU the node lacks, or of one not in
MIG mode, is never offered."""

from __future__ import annotations

import pytest

from gpuwatch.fleet.exposition import parse_exposition
from gpuwatch.fleet.series import PREFIXES, target_state
from gpuwatch.fleet_model import FleetState, NodeState
from gpuwatch.holders import Holder, HolderKind
from gpuwatch.placement.where import where
from gpuwatch.request import Request

TAKEN_AT = 1.7954727494912333e09
HOST = 'hostname="gpu-node-07"'
GPU0, GPU1, GPU2 = "GPU-aaaa-0", "GPU-aaaa-1", "GPU-aaaa-2"
MIG_3G, MIG_1G = "MIG-bbbb-3g", "MIG-bbbb-1g"
GIB = 1 << 30


def _gpu(index: int, uuid: str, split: bool) -> list[str]:
    labels = f'gpu="{index}",uuid="{uuid}",{HOST}'
    return [
        f'gpuwatch_gpu_info{{{labels},model_name="H100"}} 1',
        f"gpuwatch_memory_total_bytes{{{labels}}} {80 * GIB}",
        f"gpuwatch_memory_used_bytes{{{labels}}} 0",
        f"gpuwatch_memory_free_bytes{{{labels}}} {80 * GIB}",
        *([] if split else [f"gpuwatch_utilization_ratio{{{labels}}} 0"]),
        f"gpuwatch_mig_enabled{{{labels}}} {1 if split else 0}",
    ]


def _mig(uuid: str, instance: int, profile: str, gib: int) -> list[str]:
    labels = (
        f'compute_instance_id="0",gpu="2",gpu_instance_id="{instance}",{HOST},'
        f'profile="{profile}",uuid="{uuid}"'
    )
    return [
        f"gpuwatch_mig_memory_{kind}_bytes{{{labels}}} {value}"
        for kind, value in (("total", gib * GIB), ("used", 0), ("free", gib * GIB))
    ]


NODE = "\n".join(
    (
        f"gpuwatch_sample_timestamp_seconds{{{HOST}}} {TAKEN_AT}",
        f"gpuwatch_sampling_up{{{HOST}}} 1",
        *_gpu(0, GPU0, False),
        *_gpu(1, GPU1, False),
        *_gpu(2, GPU2, True),
        *_mig(MIG_3G, 1, "3g.40gb", 40),
        *_mig(MIG_1G, 2, "1g.10gb", 10),
        "",
    )
)
"""A daemon's node: GPUs 0 and 1 idle, GPU 2 split into two free MIG devices."""


def scraped(*lines: str, page: str = NODE) -> NodeState:
    samples = list(parse_exposition(page + "\n".join(lines) + "\n", PREFIXES))
    now = TAKEN_AT + 1
    return target_state(samples, fallback_name="x", seen_at=now, now=now, stale_after_s=15)


def pod(gpu: str, uuid: str, name: str, namespace: str = "ml", container: str = "main") -> str:
    labels = f'gpu="{gpu}",uuid="{uuid}",{HOST},namespace="{namespace}",pod="{name}"'
    return f'gpuwatch_gpu_pod_info{{{labels},container="{container}"}} 1'


def device(node: NodeState, uuid: str) -> object:
    assert node.snapshot is not None
    found = [d for d in (*node.snapshot.gpus, *node.snapshot.mig_devices) if d.uuid == uuid]
    assert found, uuid
    return found[0]


def test_a_daemons_pods_hold_their_gpus_and_mig_devices_each_pod_named() -> None:
    # GIVEN a daemon naming a pod on GPU 0, and two pods sharing the 1g MIG device
    node = scraped(
        pod("0", GPU0, "train-0"),
        pod("2:1", MIG_1G, "infer-a", "serving"),
        pod("2:1", MIG_1G, "infer-b", "serving"),
    )
    # THEN each holds its device, both pods the shared one; the rest is held by nobody
    holders = node.holders
    assert holders.holders_of(device(node, GPU0)) == (  # type: ignore[arg-type]
        Holder(HolderKind.POD, "ml/train-0", container="main"),
    )
    shared = holders.holders_of(device(node, MIG_1G))  # type: ignore[arg-type]
    assert [h.name for h in shared] == ["serving/infer-a", "serving/infer-b"]
    assert holders.holders_of(device(node, MIG_3G)) == ()  # type: ignore[arg-type]
    # AND the screen's view of them names every pod on its GPU
    assert {(p.gpu_index, p.name) for p in node.pods} == {
        (0, "ml/train-0"),
        (2, "serving/infer-a"),
        (2, "serving/infer-b"),
    }
    # AND where gives neither device, naming both pods of the shared one
    answer = where(FleetState(0.0, "t", (node,)), Request(mig="1g.10gb"))
    assert answer.fits == ()
    assert answer.misses[0].reasons[1] == (
        "MIG 2:1 (1g.10gb): held by pod serving/infer-a (container main) and 1 more"
    )


def test_a_daemon_that_cannot_tell_makes_every_device_unknown() -> None:
    # GIVEN a daemon whose scheduler does not answer
    node = scraped(f"gpuwatch_holders_known{{{HOST}}} 0")
    # THEN no device is offered, each for that reason
    answer = where(FleetState(0.0, "t", (node,)), Request(allow_busy=True))
    assert answer.fits == ()
    unknown = [r for r in answer.misses[0].reasons if "holders unknown: its daemon cannot" in r]
    assert len(unknown) == 2  # GPUs 0 and 1 (2 is split: given only as MIG devices)
    # AND allowed to, where takes them anyway
    anyway = where(
        FleetState(0.0, "t", (node,)), Request(allow_busy=True, allow_unknown_holders=True)
    )
    assert anyway.fits


@pytest.mark.parametrize(
    "line",
    [
        f'gpuwatch_gpu_holders_unknown{{gpu="1",uuid="{GPU1}",{HOST}}} 1',
        pod("1", GPU1, "", "ml"),
        pod("1", GPU1, "train-0", ""),
        f'gpuwatch_gpu_job_info{{gpu="1",uuid="{GPU1}",{HOST},job_id="",job_user="ada"}} 1',
        f'gpuwatch_gpu_job_info{{gpu="1",{HOST},job_id="7",job_user="{"u" * 250}"}} 1',
    ],
    ids=["said-unknown", "empty-pod", "empty-namespace", "empty-job-id", "user-250"],
)
def test_a_holder_that_cannot_be_believed_makes_its_gpu_unknown_alone(line: str) -> None:
    # GIVEN a daemon naming GPU 1's holder in a way that cannot be believed
    node = scraped(line)
    # THEN GPU 1 is unknown, never free, and GPU 0 stays free
    gpu1, gpu0 = device(node, GPU1), device(node, GPU0)
    assert node.holders.unknown_of(gpu1) is not None  # type: ignore[arg-type]
    assert node.holders.unknown_of(gpu0) is None  # type: ignore[arg-type]
    answer = where(FleetState(0.0, "t", (node,)), Request(count=2, allow_busy=True))
    assert answer.fits == ()
    assert answer.misses[0].reasons[1].startswith("GPU 1: holders unknown: ")


def test_a_pod_on_a_mig_device_the_node_does_not_show_holds_the_whole_gpu() -> None:
    # GIVEN a pod on GPU 2's MIG device 2:5, of which the daemon exports no series
    node = scraped(pod("2:5", "MIG-not-shown", "ghost"))
    # THEN neither MIG device of GPU 2 is offered: which one it holds cannot be told
    answer = where(FleetState(0.0, "t", (node,)), Request(mig="any"))
    assert answer.fits == ()


@pytest.mark.parametrize(
    ("gpu", "why"),
    [("7", "a GPU the node lacks"), ("0", "a GPU not in MIG mode")],
    ids=["absent-gpu", "mig-mode-off"],
)
def test_a_mig_device_of_a_gpu_that_is_not_split_is_never_offered(gpu: str, why: str) -> None:
    # GIVEN a daemon telling a free MIG device on `why`
    labels = f'compute_instance_id="0",gpu="{gpu}",gpu_instance_id="9",{HOST},profile="1g.10gb"'
    node = scraped(
        *(
            f'gpuwatch_mig_memory_{kind}_bytes{{{labels},uuid="MIG-bogus"}} {value}'
            for kind, value in (("total", 10 << 30), ("used", 0), ("free", 10 << 30))
        )
    )
    # THEN the node has no such device, and where offers only GPU 2's free one
    assert node.snapshot is not None
    assert "MIG-bogus" not in {d.uuid for d in node.snapshot.mig_devices}
    answer = where(FleetState(0.0, "t", (node,)), Request(mig="1g.10gb"))
    offered = [d.uuid for fit in answer.fits for d in fit.devices]
    assert offered == [MIG_1G]


DCGM_LABELS = 'gpu="0",UUID="GPU-d",device="nvidia0",modelName="NVIDIA A30",Hostname="dcgm-1"'


def test_two_pods_dcgm_exporter_labels_on_one_gpu_instance_both_hold_it() -> None:
    # GIVEN dcgm-exporter series of GPU 0's instance 1 (a time-sliced MIG device) labelled
    # with two pods, and instance 2 with none
    def series(instance: str, pod_labels: str) -> str:
        labels = f'{DCGM_LABELS},GPU_I_ID="{instance}",GPU_I_PROFILE="1g.6gb"{pod_labels}'
        return "\n".join(
            f"DCGM_FI_DEV_FB_{kind}{{{labels}}} {mib}"
            for kind, mib in (("FREE", 5000), ("USED", 0))
        )

    page = "\n".join(
        (
            series("1", ',namespace="ml",pod="a",container="c"'),
            series("1", ',namespace="ml",pod="b",container="c"'),
            series("2", ""),
        )
    )
    node = scraped(page=page + "\n")
    # THEN both pods hold instance 1, and where offers instance 2 alone
    assert {p.name for p in node.pods if p.gpu_instance_id == 1} == {"ml/a", "ml/b"}
    answer = where(FleetState(0.0, "t", (node,)), Request(mig="any"))
    assert [d.gpu_instance_id for fit in answer.fits for d in fit.devices] == [2]  # type: ignore[union-attr]
