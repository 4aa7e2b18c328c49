"""gres.conf worked out as slurmd works it out, without slurmd (test_gres_conf_slurmd.py
checks the same rules against the real one): lines for other nodes, case, MIG devices,
slurm.conf's say, and the node's name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatch.jobs import SlurmJobs
from gpuwatch.jobs.gres import node_gpu_minors
from gpuwatch.jobs.gres_conf import GresOrderUnknown, GresSlot, gpu_layout

GRES_CONF = """\
# a site's gres.conf
AutoDetect=off
NodeName=gpu[01-02] Name=gpu Type=a100 File=/dev/nvidia[0-3]
NodeName=gpu03 Name=gpu File=/dev/nvidia3,/dev/nvidia1   # wired the other way round
NodeName=gpu03 Name=gpu File=/dev/nvidia0
Name=mps Count=400
NodeName=gpu03 name=GPU file=/dev/nvidia2
"""


def layout_files(
    tmp_path: Path, text: str, node: str, slurm_conf: str | None = None
) -> list[tuple[str, ...]]:
    (tmp_path / "gres.conf").write_text(text)
    conf = None
    if slurm_conf is not None:
        conf = tmp_path / "slurm.conf"
        conf.write_text(slurm_conf)
    return [slot.files for slot in gpu_layout(tmp_path / "gres.conf", conf, node).slots]


@pytest.mark.parametrize(
    ("node", "files"),
    [
        pytest.param("gpu02", [f"/dev/nvidia{n}" for n in range(4)], id="range"),
        pytest.param(
            "gpu03",
            ["/dev/nvidia3", "/dev/nvidia1", "/dev/nvidia0", "/dev/nvidia2"],
            id="conf-order-over-lines",
        ),
    ],
)
def test_a_nodes_gpus_in_gres_confs_order(tmp_path: Path, node: str, files: list[str]) -> None:
    # GIVEN a gres.conf for several nodes WHEN a node's GPUs are read
    # THEN they come in gres.conf's order, which is the GRES index order
    assert layout_files(tmp_path, GRES_CONF, node) == [(file,) for file in files]


def test_a_node_gres_conf_gives_no_gpu_is_unknown_not_gpuless(tmp_path: Path) -> None:
    with pytest.raises(GresOrderUnknown, match="lists no GPU File= for node cpu01"):
        layout_files(tmp_path, GRES_CONF, "cpu01")


def test_a_mig_device_is_one_index_and_part_of_its_gpu(tmp_path: Path) -> None:
    # GIVEN a MIG device named by its GPU's and its capability's files, then a whole GPU
    text = (
        "Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21\n"
        "Name=gpu File=/dev/nvidia1\n"
    )
    (tmp_path / "gres.conf").write_text(text)
    # WHEN the node's GPUs are numbered
    slots = gpu_layout(tmp_path / "gres.conf", None, "vm").slots
    # THEN the MIG device is GRES index 0, on GPU nvidia0; nvidia1 is index 1
    assert slots == (
        GresSlot(("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21")),
        GresSlot(("/dev/nvidia1",)),
    )
    assert node_gpu_minors(tmp_path / "gres.conf", None, "vm") == [0, 1]


def test_several_types_need_slurm_confs_order(tmp_path: Path) -> None:
    # GIVEN two GPU types, and slurm.conf naming the second first
    text = "Name=gpu Type=v100 File=/dev/nvidia0\nName=gpu Type=a100 File=/dev/nvidia1\n"
    slurm_conf = "NodeName=vm Gres=gpu:a100:1,gpu:v100:1 CPUs=4\n"
    # THEN slurm.conf's order is slurmd's
    assert layout_files(tmp_path, text, "vm", slurm_conf) == [("/dev/nvidia1",), ("/dev/nvidia0",)]
    # AND without slurm.conf's say, the order is not known
    with pytest.raises(GresOrderUnknown, match="several GPU types"):
        layout_files(tmp_path, text, "vm")


def test_a_node_slurm_conf_does_not_define_is_a_name_mismatch(tmp_path: Path) -> None:
    # GIVEN slurm.conf defining node gpu-07 (the daemon runs where the host is called vm)
    slurm_conf = "NodeName=DEFAULT Gres=gpu:1\nNodeName=gpu-07 CPUs=4\n"
    # WHEN the GPUs of "vm" are asked THEN it says that Slurm calls this node otherwise
    with pytest.raises(GresOrderUnknown, match=r"defines no node named vm.*--node-name"):
        layout_files(tmp_path, "Name=gpu File=/dev/nvidia0\n", "vm", slurm_conf)
    # AND the node's own name, with NodeName=DEFAULT's Gres, reads its GPU
    assert layout_files(tmp_path, "Name=gpu File=/dev/nvidia0\n", "gpu-07", slurm_conf) == [
        ("/dev/nvidia0",)
    ]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        pytest.param(
            "Name=gpu File=/dev/nvidia0\nName=gpu Count=2\n",
            "with and without File=",
            id="mixed-file",
        ),
        pytest.param(
            "Name=gpu File=/dev/nvidia0 MultipleFiles=/dev/nvidia[1-2]\n",
            "File= with MultipleFiles=",
            id="both-files",
        ),
        pytest.param(
            "Name=gpu File=/dev/nvidia[0-1] Count=3\n", "Count= unlike", id="count-mismatch"
        ),
        pytest.param("Bogus=1\n", "refuses the key Bogus", id="unknown-line"),
    ],
)
def test_what_slurmd_refuses_makes_the_order_unknown(tmp_path: Path, text: str, why: str) -> None:
    with pytest.raises(GresOrderUnknown, match=why):
        layout_files(tmp_path, text, "vm")


NODE = Path(__file__).parent / "data" / "slurm-node.toml"
DEADLINE_S = 60.0  # generous: the test machine's cores are shared


@pytest.mark.parametrize(
    ("gres_conf", "slurm_conf", "says"),
    [
        pytest.param(
            "NodeName=a[0-65535]b[0-65535] Name=gpu File=/dev/nvidia0\n",
            "",
            "more than 65536 names",
            id="gres-conf-nodes-4-gi-names",
        ),
        pytest.param(
            "Name=gpu File=/dev/nvidia[0-65535]\n", "", "more than 1024 GPUs", id="65536-files"
        ),
        pytest.param(
            "Name=gpu File=/dev/nvidia" + "[1]" * 1500 + "\n", "", "brackets", id="1500-brackets"
        ),
        pytest.param(
            "Name=gpu File=/dev/nvidia[" + "1" * 5000 + "]\n", "", "digits", id="5000-digits"
        ),
        pytest.param("include gpus.fifo\n", "", "a FIFO", id="include-of-a-fifo"),
        pytest.param(
            "Name=gpu File=/dev/nvidia[0-3]\n",
            "NodeName=a[0-65535]x[0-65535] Gres=gpu:4\n",
            "more than 65536 names",
            id="slurm-conf-nodes-4-gi-names",
        ),
        pytest.param(
            "Name=gpu File=/dev/nvidia[0-3]\n",
            "include nodes.fifo\n",
            "a FIFO",
            id="slurm-conf-include-of-a-fifo",
        ),
    ],
)
def test_the_reader_and_pick_in_a_step_say_the_same_one_line(
    tmp_path: Path, gres_conf: str, slurm_conf: str, says: str
) -> None:
    # GIVEN a gres.conf or slurm.conf beyond what is read (or that Slurm could not read)
    os.mkfifo(tmp_path / "gpus.fifo")
    os.mkfifo(tmp_path / "nodes.fifo")
    (tmp_path / "gres.conf").write_text(gres_conf)
    (tmp_path / "slurm.conf").write_text(slurm_conf)
    env = {
        "PATH": os.environ["PATH"],
        "SLURM_CONF": str(tmp_path / "slurm.conf"),
        "SLURMD_NODENAME": "vm",
    }
    # WHEN the job reader reads them, and pick chooses in a step of GRES index 0
    jobs = SlurmJobs(env=env, timeout_s=DEADLINE_S)
    assert jobs.table() is None
    step = {**env, "SLURM_JOB_ID": "1", "SLURM_STEP_GPUS": "0", "GPUWATCH_SIM": str(NODE)}
    step["GPUWATCH_LEASE_DIR"] = str(tmp_path / "leases")
    picked = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "pick", "--", "true"],
        env=step,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )
    # THEN the jobs are unknown for one line's reason, and pick says that line and stops
    why = jobs.unknown_why()
    assert says in why and "\n" not in why and len(why) < 300
    assert picked.returncode == 2 and picked.stdout == ""
    (line,) = picked.stderr.splitlines()
    assert why in line
