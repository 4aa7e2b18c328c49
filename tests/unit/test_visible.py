"""CUDA_VISIBLE_DEVICES: reading the allowed set, writing the child's."""

from __future__ import annotations

import pytest

from gpuwatch.errors import VisibleDevicesError
from gpuwatch.models import GpuSample
from gpuwatch.placement.visible import Format, child_environment, parse_visible_devices, resolve

H100 = "NVIDIA H100 80GB HBM3"
UUIDS = ["GPU-1e7c3a4f-0000-4d8e", "GPU-1e7c3a4f-0001-4d8e", "GPU-9b00aa11-0002-4d8e"]


def gpus(*names: str) -> list[GpuSample]:
    chosen = names or (H100,) * 3
    return [
        GpuSample(index=i, uuid=UUIDS[i], name=name, pci_bus_id=None)
        for i, name in enumerate(chosen)
    ]


@pytest.mark.parametrize(
    ("value", "entries"),
    [
        ("0,1", ("0", "1")),
        (" 2 , 0 ", ("2", "0")),
        ("GPU-1e7c3a4f-0001-4d8e,1", ("GPU-1e7c3a4f-0001-4d8e", "1")),
        ("MIG-6f3a2b1c-0000", ("MIG-6f3a2b1c-0000",)),
        ("", ()),
        ("-1", ()),
        ("0,1,-1,2", ("0", "1")),
    ],
    ids=[
        "indices",
        "spaces",
        "uuid-and-index",
        "mig",
        "empty-hides-all",
        "minus-one",
        "negative-ends-list",
    ],
)
def test_parse_accepts_what_cuda_accepts(value: str, entries: tuple[str, ...]) -> None:
    assert parse_visible_devices(value) == entries


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0,gpu1", "'gpu1' is not a GPU index"),
        ("0,,1", "'' is not a GPU index"),
        ("1,1", "names 1 twice"),
        ("cuda:0", "'cuda:0' is not a GPU index"),
    ],
    ids=["word", "empty-entry", "duplicate", "torch-style"],
)
def test_parse_refuses_malformed_values(value: str, message: str) -> None:
    with pytest.raises(VisibleDevicesError, match=message):
        parse_visible_devices(value)


@pytest.mark.parametrize(
    ("entries", "order", "expected"),
    [
        (("2", "0"), None, {0, 2}),
        (("1",), "PCI_BUS_ID", {1}),
        (("GPU-1e7c3a4f-0001-4d8e",), None, {1}),
        (("GPU-9b00",), None, {2}),
        (("MIG-6f3a2b1c-0000", "0"), None, {0}),
        (("MIG-6f3a2b1c-0000",), None, set()),
    ],
    ids=["indices", "pci-order", "full-uuid", "uuid-prefix", "mig-beside-gpu", "mig-only"],
)
def test_resolve_names_nvml_indices(
    entries: tuple[str, ...], order: str | None, expected: set[int]
) -> None:
    assert resolve(entries, gpus(), device_order=order) == expected


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (("7",), "no GPU 7 on this machine \\(it has 3\\)"),
        (("GPU-1e7c3a4f",), "matches GPUs \\[0, 1\\]; give more of the UUID"),
        (("GPU-ffff",), "GPU-ffff matches no GPU"),
    ],
    ids=["index-out-of-range", "ambiguous-prefix", "unknown-uuid"],
)
def test_resolve_refuses_what_names_no_gpu(entries: tuple[str, ...], message: str) -> None:
    with pytest.raises(VisibleDevicesError, match=message):
        resolve(entries, gpus(), device_order=None)


def test_indices_on_a_mixed_node_need_pci_order() -> None:
    mixed = gpus(H100, "NVIDIA A100-SXM4-40GB", H100)
    with pytest.raises(VisibleDevicesError, match="fastest-first order"):
        resolve(("1",), mixed, device_order=None)
    assert resolve(("1",), mixed, device_order="PCI_BUS_ID") == {1}
    assert resolve((UUIDS[1],), mixed, device_order=None) == {1}


def test_child_gets_uuids_in_the_chosen_order_by_default() -> None:
    first, second = gpus()[2], gpus()[0]
    env = child_environment(
        [first, second], Format.UUID, {"CUDA_DEVICE_ORDER": "FASTEST_FIRST", "HOME": "/root"}
    )
    assert env["CUDA_VISIBLE_DEVICES"] == f"{UUIDS[2]},{UUIDS[0]}"
    assert env["HOME"] == "/root"


def test_index_format_fixes_the_device_order_beside_the_indices() -> None:
    env = child_environment(
        [gpus()[2], gpus()[0]], Format.INDEX, {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "2,0"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
