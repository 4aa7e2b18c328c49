"""Every form of device id the device plugins give NVIDIA GPUs and MIG devices, read through
the kubelet stand-in (pod-resources v1 over gRPC) onto a simulated node whose minor numbers
do not follow NVML's order: each names the device it should, by UUID, and one that cannot
be mapped puts in doubt what it may be on, never nothing. Which resources are GPUs comes
from the kubelet's offered devices (`GetAllocatableResources`), or, from a kubelet without
them, from the resources' names; a DRA claim puts the whole node in doubt.

Sources of the forms, in the device plugins' own code and docs:
- NVIDIA/k8s-device-plugin `internal/rm/devices.go`: `BuildDevice` gives each device its
  UUID as id, `NewAnnotatedID` a replica's `ID::N`; `internal/rm/device_map.go`: MIG devices
  under the `mixed` strategy as `nvidia.com/mig-<profile>`, under `single` as
  `nvidia.com/gpu`, a device's `Index` `i` or `i:j` (`newMigDevice(i, j, ...)`, what its
  `--device-id-strategy=index` hands the runtime), replicas renamed `<name>.shared`;
  `api/config/v1/resources.go`: any resource name (`resources.gpus[].name`) under
  `$RESOURCE_PREFIX`, `nvidia.com` by default.
- GoogleCloudPlatform/container-engine-accelerators `pkg/gpu/nvidia/manager.go` (`nvidiaN`,
  the device file `/dev/nvidiaN`), `mig/mig.go` (`nvidiaN/giM`, from the driver's
  `capabilities/gpuN/mig/giM`), `gpusharing/gpusharing.go` (`nvidiaN/vgpuK`,
  `nvidiaN/giM/vgpuK`).
- NVIDIA's network operator (docs.nvidia.com/networking, "Host Device Network with RDMA"):
  SR-IOV NICs as `nvidia.com/hostdev`, by PCI address: no GPU.
- Kubernetes `pkg/kubelet/apis/podresources/server_v1.go`: `GetAllocatableResources` answers
  "Pod Resources API GetAllocatableResources disabled" while its feature gate is off
  (1.21-1.27), and is unknown before 1.21 (gRPC `UNIMPLEMENTED`).
- NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu): driver `gpu.nvidia.com`.
"""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest
from msgspec.structs import replace

from gpuwatch.backends.sim import SimBackend
from gpuwatch.jobs.job_table import JobTable
from gpuwatch.jobs.kubernetes import KubeletPods
from gpuwatch.models import Device, MigDevice, Snapshot
from tests.helpers.kubelet import Claim, Container, PodSpec, device_pod, kubelet_stand_in

# GPU 0 is /dev/nvidia2, GPU 1 /dev/nvidia0, GPU 2 /dev/nvidia1, split into MIG devices 2:0
# (GPU instance 1) and 2:1 (GPU instance 2).
NODE = """
[[gpu]]
minor = 2
[[gpu]]
minor = 0
[[gpu]]
model = "A100-80GB"
minor = 1
mig = ["3g.40gb", "1g.10gb"]
"""
EVERY_DEVICE = ["0", "1", "2", "2:0", "2:1"]


@pytest.fixture
def node(tmp_path: Path) -> Snapshot:
    (tmp_path / "node.toml").write_text(NODE)
    return SimBackend(tmp_path / "node.toml").sample()


def label(device: Device) -> str:
    """`1` for GPU 1, `2:0` for MIG device 0 of GPU 2."""
    return device.label if isinstance(device, MigDevice) else str(device.index)


def devices(node: Snapshot) -> dict[str, Device]:
    return {label(d): d for d in (*node.gpus, *node.mig_devices)}


def uuid(node: Snapshot, name: str) -> str:
    """The UUID of device `name` (`1`, `2:0`)."""
    return str(devices(node)[name].uuid)


def read(node: Snapshot, *pods: PodSpec, **kubelet: object) -> JobTable:
    """The table the engine reads, knowing `node`, from a stand-in serving `pods` (its
    fields set from `kubelet`)."""
    with kubelet_stand_in(*pods) as stand_in:
        for name, value in kubelet.items():
            setattr(stand_in, name, value)
        engine = KubeletPods(stand_in.socket_path)
        engine.observe(node)
        pending = engine.start()
        assert pending is not None
        pending.join(engine.timeout_s + 5)
        table = engine.latest()
    assert table is not None, engine.unknown_why()
    return table


def held(table: JobTable, node: Snapshot) -> dict[str, list[str]]:
    """Each held device by label, and who holds it."""
    holders = table.holders(node)
    return {
        name: [holder.name for holder in holders.holders_of(device)]
        for name, device in devices(node).items()
        if holders.holders_of(device)
    }


def unknown(table: JobTable, node: Snapshot) -> dict[str, str]:
    """Each device whose holders are unknown by label, and why."""
    holders = table.holders(node)
    return {
        name: why
        for name, device in devices(node).items()
        if (why := holders.unknown_of(device)) is not None
    }


# (id, resource, the devices it holds); `<2:1>` in an id is that device's UUID
FORMS = [
    ("<1>", "nvidia.com/gpu", ["1"]),  # BuildDevice: the UUID
    ("<2:1>", "nvidia.com/mig-1g.10gb", ["2:1"]),  # MIG strategy mixed
    ("<2:0>", "nvidia.com/gpu", ["2:0"]),  # MIG strategy single
    ("<1>::3", "nvidia.com/gpu", ["1"]),  # timeSlicing replicas (NewAnnotatedID)
    ("<0>::0", "nvidia.com/gpu.shared", ["0"]),  # renameByDefault
    ("<2:1>::1", "nvidia.com/mig-1g.10gb", ["2:1"]),  # a time-sliced MIG device
    ("1", "nvidia.com/gpu", ["1"]),  # Device.Index of a GPU
    ("2:1", "nvidia.com/mig-1g.10gb", ["2:1"]),  # Device.Index of a MIG device, mixed
    ("2:0", "nvidia.com/gpu", ["2:0"]),  # ... and single
    ("nvidia0", "nvidia.com/gpu", ["1"]),  # GKE: /dev/nvidia0 is GPU 1
    ("nvidia1", "nvidia.com/gpu", ["2", "2:0", "2:1"]),  # a whole GPU holds its MIG devices
    ("nvidia1/gi2", "nvidia.com/gpu", ["2:1"]),  # GKE: GPU instance 2 of /dev/nvidia1
    ("nvidia2/vgpu3", "nvidia.com/gpu", ["0"]),  # GKE: a time-shared GPU's replica
    ("nvidia1/gi1/vgpu0", "nvidia.com/gpu", ["2:0"]),  # ... of a GPU instance
    ("<0>", "nvidia.com/a100", ["0"]),  # resources.gpus[].name
    ("<0>", "example.org/a100", ["0"]),  # RESOURCE_PREFIX
    ("0", "nvidia.com/a100", ["0"]),  # an index, of a renamed resource it offers
]


@pytest.mark.parametrize(
    ("device_id", "resource", "expected"),
    FORMS,
    ids=[
        "gpu-uuid",
        "mig-uuid-mixed",
        "mig-uuid-single",
        "replica",
        "replica-renamed-shared",
        "mig-replica",
        "gpu-index",
        "mig-index-mixed",
        "mig-index-single",
        "gke-gpu-by-device-file",
        "gke-gpu-of-mig-devices",
        "gke-gpu-instance",
        "gke-vgpu",
        "gke-gpu-instance-vgpu",
        "renamed-resource",
        "other-prefix",
        "renamed-resource-by-index",
    ],
)
def test_each_form_of_device_id_names_its_device_by_uuid(
    node: Snapshot, device_id: str, resource: str, expected: list[str]
) -> None:
    # GIVEN a pod holding a device by this form of id
    said = re.sub(r"<([0-9:]+)>", lambda named: uuid(node, named[1]), device_id)
    # WHEN the engine reads it
    table = read(node, device_pod("ml", "train-0", "main", resource, said))
    # THEN the pod holds that device, by UUID, and nothing else; nothing is in doubt
    assert held(table, node) == {name: ["ml/train-0"] for name in expected}
    assert table.doubts == () and unknown(table, node) == {}
    (job,) = table.jobs
    assert all(u.startswith(("GPU-", "MIG-")) for u in job.device_uuids)


def test_replicas_of_one_gpu_are_held_by_every_pod_given_one(node: Snapshot) -> None:
    # GIVEN two pods given replicas of GPU 1 (time-slicing), one by UUID, one on GKE's form
    table = read(
        node,
        device_pod("ml", "a", "main", "nvidia.com/gpu", f"{uuid(node, '1')}::0"),
        device_pod("ml", "b", "main", "nvidia.com/gpu", "nvidia0/vgpu1"),
    )
    # THEN both hold it
    assert held(table, node) == {"1": ["ml/a", "ml/b"]}


# (id, resource, the devices in doubt, what the reason says)
UNMAPPED = [
    ("nvidia1/gi9", "nvidia.com/gpu", ["2", "2:0", "2:1"], "no GPU instance 9 of GPU /dev/nvidia1"),
    ("nvidia9", "nvidia.com/gpu", EVERY_DEVICE, "no GPU /dev/nvidia9 here"),
    ("nvidia9/gi1", "nvidia.com/gpu", EVERY_DEVICE, "no GPU /dev/nvidia9 here"),
    ("GPU-00000000-0000-0000-0000-000000000000", "nvidia.com/gpu", EVERY_DEVICE, "no device"),
    ("MIG-00000000-0000-0000-0000-000000000000", "nvidia.com/mig-1g.10gb", EVERY_DEVICE, "no"),
    ("7", "nvidia.com/gpu", EVERY_DEVICE, "no GPU of NVML index 7 here"),
    ("2:5", "nvidia.com/mig-1g.10gb", ["2", "2:0", "2:1"], "no MIG device 2:5 here"),
    ("0:0", "nvidia.com/mig-1g.10gb", ["0"], "no MIG device 0:0 here"),
    ("gpu-a7", "nvidia.com/gpu", EVERY_DEVICE, "a form of device id gpuwatch does not know"),
    ("0/gi1", "nvidia.com/mig-3g.40gb", EVERY_DEVICE, "a form of device id"),
]


@pytest.mark.parametrize(
    ("device_id", "resource", "in_doubt", "why"),
    UNMAPPED,
    ids=[
        "gke-gpu-instance-not-here",
        "gke-gpu-not-here",
        "gke-gpu-instance-of-a-gpu-not-here",
        "gpu-uuid-not-here",
        "mig-uuid-not-here",
        "gpu-index-not-here",
        "mig-index-not-here",
        "mig-index-of-a-whole-gpu",
        "form-not-known",
        "form-not-known-in-a-mig-resource",
    ],
)
def test_an_id_that_cannot_be_mapped_puts_in_doubt_what_it_may_be_on(
    node: Snapshot, device_id: str, resource: str, in_doubt: list[str], why: str
) -> None:
    # GIVEN a pod on GPU 1 and another holding a device by an id that names no device here
    table = read(
        node,
        device_pod("ml", "a", "main", "nvidia.com/gpu", uuid(node, "1")),
        device_pod("ml", "b", "main", resource, device_id),
    )
    # THEN the devices it may be on have unknown holders, and the reason names pod and id
    (doubt,) = table.doubts
    assert doubt.why.startswith(f"pod ml/b (container main) holds {device_id} of {resource}: ")
    assert why in doubt.why
    assert sorted(unknown(table, node)) == sorted(in_doubt)
    # AND the rest of the answer stands: the other pod still holds GPU 1
    assert held(table, node)["1"] == ["ml/a"]
    assert [job.job_id for job in table.jobs] == ["ml/a"]


def test_a_device_file_is_in_doubt_where_the_driver_does_not_tell_minor_numbers(
    node: Snapshot,
) -> None:
    # GIVEN a driver that does not tell GPU 0's minor number (/dev/nvidia2)
    untold = replace(node, gpus=(replace(node.gpus[0], minor_number=None), *node.gpus[1:]))
    # WHEN a pod holds /dev/nvidia2 by GKE's name
    table = read(untold, device_pod("ml", "a", "main", "nvidia.com/gpu", "nvidia2"))
    # THEN which GPU that is cannot be told: every device is in doubt, and the reason says why
    assert sorted(unknown(table, untold)) == EVERY_DEVICE
    assert table.doubts[0].why.endswith(
        "no GPU /dev/nvidia2 here (the driver does not tell every GPU's minor number)"
    )


def test_a_pod_holding_a_device_that_maps_and_one_that_does_not_is_both(node: Snapshot) -> None:
    # GIVEN a pod holding GPU 0 and GKE's name of a GPU instance the node does not have
    pod = PodSpec(
        "ml",
        "a",
        (Container("main", (("nvidia.com/gpu", (uuid(node, "0"), "nvidia1/gi7")),)),),
    )
    table = read(node, pod)
    # THEN it holds GPU 0, and GPU 2 (whose instance it names) is in doubt
    assert held(table, node) == {"0": ["ml/a"]}
    assert sorted(unknown(table, node)) == ["2", "2:0", "2:1"]


def test_gpus_named_before_they_are_known_are_in_doubt_until_they_are(node: Snapshot) -> None:
    # GIVEN a device plugin naming GPUs by index and GKE's device files
    pod = PodSpec("ml", "a", (Container("main", (("nvidia.com/gpu", ("0", "nvidia1/gi2")),)),))
    with kubelet_stand_in(pod) as kubelet:
        engine = KubeletPods(kubelet.socket_path)
        # WHEN the engine asks before it knows the GPUs
        pending = engine.start()
        assert pending is not None
        pending.join(engine.timeout_s + 5)
        before = engine.latest()
        # THEN every device is in doubt, and it says it lacked the GPUs
        assert before is not None and engine.lacked_gpus()
        assert sorted(unknown(before, node)) == EVERY_DEVICE
        assert "the node's GPUs are not known yet" in before.doubts[0].why
        # WHEN it is told the GPUs and asks again
        engine.observe(node)
        pending = engine.start()
        assert pending is not None
        pending.join(engine.timeout_s + 5)
        after = engine.latest()
    # THEN the pod holds GPU 0 and MIG device 2:1, and nothing is in doubt
    assert after is not None and not engine.lacked_gpus()
    assert held(after, node) == {"0": ["ml/a"], "2:1": ["ml/a"]} and after.doubts == ()


# which resources are GPUs


HOSTDEV = ("nvidia.com/hostdev", "0000:3b:00.2")  # NVIDIA's network operator: a NIC


def mixed_pod(node: Snapshot) -> PodSpec:
    """A pod holding a GPU by index, a NIC of NVIDIA's network operator, a GPU of a renamed
    resource of another prefix by UUID (and the stand-in's FPGA)."""
    devices = (
        ("nvidia.com/gpu", ("1",)),
        (HOSTDEV[0], (HOSTDEV[1],)),
        ("example.org/a100", (uuid(node, "0"),)),
    )
    return PodSpec("ml", "a", (Container("main", devices),))


def test_the_offered_devices_tell_which_resources_are_gpus(node: Snapshot) -> None:
    # GIVEN a kubelet that lists what its device plugins offer
    table = read(node, mixed_pod(node))
    # THEN the GPUs are held, whatever their resource is called, and the NIC is no GPU
    assert held(table, node) == {"0": ["ml/a"], "1": ["ml/a"]}
    assert table.doubts == ()


@pytest.mark.parametrize(
    "error",
    [
        (grpc.StatusCode.UNIMPLEMENTED, "unknown method GetAllocatableResources"),
        (grpc.StatusCode.UNKNOWN, "Pod Resources API GetAllocatableResources disabled"),
    ],
    ids=["before-1.21", "feature-gate-off"],
)
def test_without_offered_devices_resources_are_gpus_by_name(
    node: Snapshot, error: tuple[grpc.StatusCode, str]
) -> None:
    # GIVEN a kubelet that cannot say what its device plugins offer
    table = read(node, mixed_pod(node), allocatable_error=error)
    # THEN the GPUs its pod holds are still found, by NVIDIA's names and NVML's UUIDs
    assert held(table, node) == {"0": ["ml/a"], "1": ["ml/a"]}
    # AND the NIC, taken for a GPU by its name, is a doubt of the node that says so
    (doubt,) = table.doubts
    assert doubt.whole_node
    assert doubt.why == (
        f"pod ml/a (container main) holds {HOSTDEV[1]} of {HOSTDEV[0]}: a form of device id "
        "gpuwatch does not know (a GPU by its resource's name alone)"
    )


def test_a_kubelet_that_fails_to_say_what_it_offers_makes_the_pods_unknown(
    node: Snapshot,
) -> None:
    with kubelet_stand_in(mixed_pod(node)) as kubelet:
        kubelet.allocatable_error = (grpc.StatusCode.INTERNAL, "device manager not ready")
        engine = KubeletPods(kubelet.socket_path)
        engine.observe(node)
        pending = engine.start()
        assert pending is not None
        pending.join(engine.timeout_s + 5)
    assert engine.latest() is None
    assert engine.unknown_why() == (
        "the kubelet's pod-resources API failed: INTERNAL: device manager not ready"
    )


# DRA


@pytest.mark.parametrize(
    ("driver", "device"),
    [("gpu.nvidia.com", "gpu-0"), ("sriovnetwork.example.com", "vf-3")],
    ids=["nvidia-gpu-driver", "another-driver"],
)
def test_a_dra_claim_puts_the_whole_node_in_doubt(node: Snapshot, driver: str, device: str) -> None:
    # GIVEN a pod on GPU 1 by the device plugin, and one holding a device by a DRA claim
    claim = Claim("gpu-claim", driver, device, cdi_device=f"k8s.{driver}/claim=x-{device}")
    table = read(
        node,
        device_pod("ml", "a", "main", "nvidia.com/gpu", uuid(node, "1")),
        PodSpec("ml", "b", (Container("main", claims=(claim,)),)),
    )
    # THEN no device of the node is free: each may be what the claim holds, and says so
    why = f"pod ml/b (container main) holds {driver}/node/{device} by DRA claim ml/gpu-claim"
    assert unknown(table, node) == {name: f"{why}: not mapped to a GPU" for name in EVERY_DEVICE}
    # AND the pod the device plugin tells of still holds its GPU
    assert held(table, node) == {"1": ["ml/a"]}
