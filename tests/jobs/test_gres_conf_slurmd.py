"""gres.conf as slurmd reads it: for each layout (published files under data/gres/, each
with its source, and a few written here for what no published file shows), the GPU order
real `slurmd -G` reports on this machine is the order gpuwatch uses; where gpuwatch cannot
know slurmd's order it says so, never guesses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuwatch.jobs.gres_conf import DetectedGpu, GresOrderUnknown, gpu_layout
from tests.helpers.slurmd_gres import local_text, slurmd_gpus, why_not, write_config

DATA = Path(__file__).parent / "data" / "gres"

REPRO = """\
NodeName=vm Name=gpu \\
  File=/dev/nvidia7,/dev/nvidia5
NodeName=vm Name=gpu File=/dev/nvidia6,/dev/nvidia4
"""
"""Issue 28's repro: a continued line, whose files slurmd lists first."""


@dataclass(frozen=True)
class Layout:
    """One gres.conf (a file under data/gres/, or text), the node slurmd runs as, that
    node's `Gres=` in slurm.conf, included files, and NVML's GPUs (for AutoDetect)."""

    gres_conf: str
    node: str
    gres: str
    includes: dict[str, str] = field(default_factory=dict)
    detected: tuple[tuple[str, str], ...] | None = None
    unknown: str | None = None
    """Where gpuwatch cannot know slurmd's order: words its reason holds."""

    def text(self) -> str:
        path = DATA / self.gres_conf
        return path.read_text() if path.suffix == ".conf" and path.exists() else self.gres_conf


def pcluster(root: Path) -> dict[str, str]:
    """AWS ParallelCluster's include chain: gres.conf includes a file beside it, which
    includes absolute paths (`<DIR>` in the recorded files: the generator's folder)."""
    base = DATA / "parallelcluster"
    files = {
        "slurm_parallelcluster_gres.conf": base / "slurm_parallelcluster_gres.conf",
        **{
            f"pcluster/{path.name}": path
            for path in sorted((base / "pcluster").iterdir())
            if path.suffix == ".conf"
        },
    }
    return {name: path.read_text().replace("<DIR>", str(root)) for name, path in files.items()}


NVML_SHUFFLED = tuple(
    (f"/dev/nvidia{minor}", "nvidia_geforce_rtx_3090") for minor in (3, 1, 0, 2, 7, 5, 4, 6)
)

LAYOUTS = [
    pytest.param(Layout(REPRO, "vm", "gpu:4"), id="issue28-continued-line"),
    pytest.param(
        Layout(
            "NodeName=vm Name=gpu File=/dev/nvidia7 # by node\nName=gpu File=/dev/nvidia[5,6]\n"
            "NodeName=vm,other Name=gpu File=/dev/nvidia4\n",
            "vm",
            "gpu:4",
        ),
        id="name-lines-before-nodename-lines",
    ),
    pytest.param(
        Layout(
            "include sub/gpus.conf\nName=gpu File=/dev/nvidia3\n",
            "vm",
            "gpu:3",
            includes={
                "sub/gpus.conf": "include more.conf\n",
                "sub/more.conf": REPRO.replace(
                    "NodeName=vm Name=gpu File=/dev/nvidia6,/dev/nvidia4\n", ""
                ),
            },
        ),
        id="include-relative-to-the-including-file",
    ),
    pytest.param(
        Layout("parallelcluster/gres.conf", "gpu-dy-gpu-p3dn24xlarge-3", "gpu:v100:8"),
        id="parallelcluster-include-chain",
    ),
    pytest.param(
        Layout("slurm-man-2-three-gpus-commented.conf", "vm", "gpu:tesla:3"),
        id="man-2-commented-range",
    ),
    pytest.param(Layout("slurm-man-3-hostlists.conf", "tux3", "gpu:3"), id="man-3-tux3"),
    pytest.param(Layout("slurm-man-3-hostlists.conf", "tux12", "gpu:4"), id="man-3-tux12"),
    pytest.param(
        Layout("slurm-man-4-nvml-except-one-node.conf", "tux3", "gpu:4"),
        id="man-4-local-autodetect-off",
    ),
    pytest.param(
        Layout("slurm-man-5-autodetect-per-node.conf", "tux13", "gpu:4"), id="man-5-file-node"
    ),
    pytest.param(
        Layout(
            "danielmc81-tabs-nodename-types.conf", "visualizacion1", "gpu:gtx1060:1,gpu:gtx970:1"
        ),
        id="tabs-types-in-slurm-conf-order",
    ),
    pytest.param(
        Layout("danielmc81-tabs-nodename-types.conf", "ibnodo2", "gpu:m2070q:4"),
        id="tabs-lowercase-nodename-hostlist",
    ),
    pytest.param(Layout("lyulyul-range-0-9.conf", "vm", "gpu:10"), id="range-0-9"),
    pytest.param(Layout("turagalab-range-0-7.conf", "vm", "gpu:8"), id="range-0-7"),
    pytest.param(Layout("yyuzhongpv-cpus-8gpu.conf", "vm", "gpu:8"), id="eight-lines-cpus"),
    pytest.param(Layout("mknoxnv-dgx1-cpus.conf", "vm", "gpu:8"), id="dgx1"),
    pytest.param(Layout("deepops-issue1195-dgx-a100-cpus.conf", "vm", "gpu:8"), id="dgx-a100"),
    pytest.param(
        Layout("ehb54-commented-autodetect-range.conf", "localhost", "gpu:tesla:3"),
        id="commented-autodetect-typed-range",
    ),
    pytest.param(
        Layout("slurm-html-autodetect-off-cores.conf", "node0", "gpu:a100:2"),
        id="autodetect-off-per-line",
    ),
    pytest.param(Layout("slurm-testsuite-test7.17.1.conf", "vm", "gpu:8"), id="testsuite-7.17.1"),
    pytest.param(Layout("slurm-testsuite-test7.17.3.conf", "vm", "gpu:8"), id="testsuite-7.17.3"),
    pytest.param(
        Layout(
            "Name=gpu Type=v100 File=/dev/nvidia[0-2]\nName=gpu Type=a100 File=/dev/nvidia3\n",
            "vm",
            "gpu:a100:1,gpu:v100:2",
        ),
        id="types-cut-to-slurm-conf-count",
    ),
    pytest.param(
        Layout(
            "Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21\n"
            "Name=gpu File=/dev/nvidia1\n",
            "vm",
            "gpu:2",
        ),
        id="mig-multiplefiles-is-one-index",
    ),
    pytest.param(
        Layout(
            "predictive-analytics-lab-nvml-with-files-mps.conf",
            "goedel",
            "gpu:nvidia_geforce_rtx_3090:8,mps:192",
            detected=NVML_SHUFFLED,
        ),
        id="autodetect-nvml-with-files-in-nvml-order",
    ),
    pytest.param(
        Layout(
            "AutoDetect=nvml\nName=gpu File=/dev/nvidia[0-3]\n",
            "vm",
            "gpu:4",
            detected=(("/dev/nvidia2", "x"), ("/dev/nvidia0", "x"), ("/dev/nvidia1", "x")),
        ),
        id="autodetect-nvml-a-file-nvml-did-not-find-last",
    ),
    pytest.param(
        Layout(
            "slaclab-autodetect-nvml-only.conf",
            "vm",
            "gpu:4",
            detected=(("/dev/nvidia1", "x"), ("/dev/nvidia0", "x")),
            unknown="AutoDetect=nvml",
        ),
        id="autodetect-nvml-alone-is-unknown",
    ),
    pytest.param(
        Layout("slurm-man-5-autodetect-per-node.conf", "tux9", "gpu:4", unknown="AutoDetect=rsmi"),
        id="autodetect-rsmi-is-unknown",
    ),
    pytest.param(
        Layout(
            "ashaneason-autodetect-nvidia-one-line.conf", "vm", "gpu:1", unknown="AutoDetect=nvidia"
        ),
        id="autodetect-nvidia-is-unknown",
    ),
    pytest.param(
        Layout(
            "ceems-mig-caps-between-gpus.conf",
            "vm",
            "gpu:a100:6,gpu:4g.20gb:2,gpu:1g.5gb:3,gpu:2g.10gb:1",
            unknown="MIG",
        ),
        id="mig-with-autodetect-is-unknown",
    ),
]


def configured(tmp_path: Path, layout: Layout) -> tuple[Path, list[DetectedGpu] | None]:
    """`layout` written under `tmp_path` (its device files made there): slurm.conf's path,
    and NVML's GPUs as gpuwatch is told them."""
    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    includes = layout.includes
    if layout.gres_conf.startswith("parallelcluster"):
        includes = pcluster(tmp_path)
    slurm_conf = write_config(
        tmp_path,
        layout.text(),
        node=layout.node,
        gres=layout.gres,
        includes=includes,
        detected=layout.detected,
    )
    if layout.detected is None:
        return slurm_conf, None
    return slurm_conf, [
        DetectedGpu(local_text(file, tmp_path), kind) for file, kind in layout.detected
    ]


@pytest.mark.slow  # one slurmd per layout
@pytest.mark.parametrize("layout", [p for p in LAYOUTS if p.values[0].unknown is None])
def test_gpuwatch_orders_a_nodes_gpus_as_slurmd_does(tmp_path: Path, layout: Layout) -> None:
    # GIVEN a gres.conf, slurm.conf for the node, and for AutoDetect the GPUs NVML found
    # (slurmd's fake_gpus.conf plays NVML)
    slurm_conf, detected = configured(tmp_path, layout)
    # WHEN gpuwatch works out the node's GPUs
    found = gpu_layout(tmp_path / "gres.conf", slurm_conf, layout.node).ordered(detected)
    # THEN they are slurmd's own, GRES index by GRES index
    ours = [slot.files for slot in found]
    assert ours == [gpu.files for gpu in slurmd_gpus(slurm_conf, layout.node)]
    assert ours, "a layout of no GPU tests nothing"


@pytest.mark.parametrize("layout", [p for p in LAYOUTS if p.values[0].unknown is not None])
def test_where_slurmds_order_cannot_be_known_gpuwatch_says_why(
    tmp_path: Path, layout: Layout
) -> None:
    # GIVEN a layout whose order is the detector's (NVML found the GPUs, or another one did)
    slurm_conf, detected = configured(tmp_path, layout)
    # WHEN gpuwatch works out the node's GPUs, even told NVML's
    # THEN it refuses to guess, and says why
    assert layout.unknown is not None
    with pytest.raises(GresOrderUnknown, match=layout.unknown):
        gpu_layout(tmp_path / "gres.conf", slurm_conf, layout.node).ordered(detected)
