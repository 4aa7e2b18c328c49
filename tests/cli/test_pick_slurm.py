"""`gpuwatch pick` inside a Slurm job or step: it chooses among the GPUs Slurm gave it.

The node is tests/jobs/data/slurm-node.toml: NVML indices 0-3 are /dev/nvidia4-7, and
gres.conf lists nvidia7, nvidia5, nvidia6, nvidia4, so GRES index 0 is NVML index 3 and
Slurm's own CUDA_VISIBLE_DEVICES=0 (without a device cgroup) is another job's GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.daemon import running_daemon

NODE = Path(__file__).parents[1] / "jobs" / "data" / "slurm-node.toml"
UUID = {minor: f"GPU-5e1a0000-0000-4000-8000-00000000000{minor}" for minor in (4, 5, 6, 7)}
"""The node's GPUs by minor number; NVML index = minor - 4."""
GRES_ORDER = (7, 5, 6, 4)

Env = dict[str, str | None]


@pytest.fixture
def step(tmp_path: Path) -> Callable[..., Env]:
    """The environment of a Slurm step given `SLURM_STEP_GPUS=gpus`, on a node whose
    gres.conf (beside SLURM_CONF, in `tmp_path`) lists the GPU files in GRES_ORDER."""
    files = ",".join(f"{tmp_path}/dev/nvidia{minor}" for minor in GRES_ORDER)
    (tmp_path / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={files}\n")

    def make(gpus: str = "0", **more: str | None) -> Env:
        return {
            "SLURM_JOB_ID": "42",
            "SLURM_STEP_GPUS": gpus,
            "SLURM_CONF": str(tmp_path / "slurm.conf"),
            "SLURMD_NODENAME": "node1",
            **more,
        }

    return make


def pick(env: Env, *args: str, node: Path = NODE) -> tuple[int, str, list[str]]:
    """`gpuwatch pick --sim NODE ARGS`: in this process when it only prints its choice, in
    a process of its own when it runs a command (which takes the process's place)."""
    if "--" not in args:
        result = run_cli("pick", "--sim", str(node), *args, env=env)
        return result.exit_code, result.stdout, result.stderr.splitlines()
    environ = {**os.environ, **env}
    done = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "pick", "--sim", str(node), *args],
        env={name: value for name, value in environ.items() if value is not None},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr.splitlines()


@pytest.mark.parametrize(
    ("gpus", "minor"),
    [("0", 7), ("1", 5), ("3", 4)],
    ids=["gres-0-is-nvidia7", "gres-1-is-nvidia5", "gres-3-is-nvidia4"],
)
def test_the_steps_gpu_is_chosen_by_its_device_file_and_written_as_uuid(
    step: Callable[..., Env], gpus: str, minor: int
) -> None:
    # GIVEN a step Slurm gave one GPU, by GRES index
    # WHEN pick prints its choice
    code, out, _ = pick(step(gpus), "--allow-busy")
    # THEN it is the GPU of the device file gres.conf lists at that index, by UUID
    assert code == 0
    assert out == f"{UUID[minor]}\n"


def test_a_batch_script_uses_the_jobs_gpus(step: Callable[..., Env]) -> None:
    # GIVEN a batch script: SLURM_JOB_GPUS only
    env = step(SLURM_STEP_GPUS=None, SLURM_JOB_GPUS="2")
    # WHEN pick prints its choice THEN it is the job's GPU (GRES 2 is /dev/nvidia6)
    assert pick(env)[:2] == (0, f"{UUID[6]}\n")


def test_the_steps_gpus_come_before_the_jobs(step: Callable[..., Env]) -> None:
    # GIVEN a step given GRES 0 of a job given GRES 0 and 1
    env = step("0", SLURM_JOB_GPUS="0,1")
    # WHEN pick is asked for two GPUs THEN the step has only one
    code, _, err = pick(env, "-n", "2")
    assert code == 2
    assert err == [
        "gpuwatch: error: 2 GPUs asked for, but this Slurm job has 1 (SLURM_STEP_GPUS=0)"
    ]


def test_slurms_visible_devices_naming_another_gpu_is_passed_over_in_one_line(
    step: Callable[..., Env],
) -> None:
    # GIVEN a step without a device cgroup: Slurm's CUDA_VISIBLE_DEVICES=0 is NVML GPU 0,
    # /dev/nvidia4, while the step's GRES 0 is /dev/nvidia7
    env = step("0", CUDA_VISIBLE_DEVICES="0")
    # WHEN pick runs a command
    code, out, err = pick(env, "--", "printenv", "CUDA_VISIBLE_DEVICES")
    # THEN the command gets the step's GPU by UUID, one line says why not Slurm's, and
    # the next which GPU was chosen
    assert (code, out) == (0, f"{UUID[7]}\n")
    assert len(err) == 2 and err[1] == "gpuwatch: chose GPU 3"
    assert err[0].startswith(
        f"gpuwatch: CUDA_VISIBLE_DEVICES=0 would name GPU 0 ({UUID[4]}), "
        f"not this step's GPU 3 ({UUID[7]}), which SLURM_STEP_GPUS=0 names"
    )


@pytest.mark.parametrize(
    ("visible", "minors"),
    [("3", {7}), (UUID[5], {5}), ("3,1", {7, 5})],
    ids=["index-of-the-steps-gpu", "uuid-of-one-of-them", "indices-of-both"],
)
def test_visible_devices_naming_the_steps_gpus_narrows_the_choice_silently(
    step: Callable[..., Env], visible: str, minors: set[int]
) -> None:
    # GIVEN a step given GRES 0 and 1 (/dev/nvidia7 and 5: NVML 3 and 1), and a
    # CUDA_VISIBLE_DEVICES naming some of them (a device cgroup's view, an earlier choice)
    env = step("0,1", CUDA_VISIBLE_DEVICES=visible)
    # WHEN pick runs a command
    code, out, err = pick(env, "--allow-busy", "--", "printenv", "CUDA_VISIBLE_DEVICES")
    # THEN it chooses among those GPUs and has nothing to say but which it chose
    assert code == 0, err
    assert out.strip() in {UUID[minor] for minor in minors}
    assert len(err) == 1 and err[0].startswith("gpuwatch: chose GPU ")


def test_other_jobs_gpus_are_named_as_such_when_none_fits(
    step: Callable[..., Env], tmp_path: Path
) -> None:
    # GIVEN the step's GPU (/dev/nvidia7, NVML 3) in use by another process
    node = tmp_path / "busy.toml"
    gpus = "".join(f'[[gpu]]\nuuid = "{UUID[m]}"\nminor = {m}\n' for m in (4, 5, 6, 7))
    node.write_text(gpus + '[[process]]\ngpu = 3\npid = 777\nuser = "bob"\nmemory = "9GiB"\n')
    # WHEN pick asks for an idle GPU
    code, _, err = pick(step("0"), node=node)
    # THEN it fails as when nothing fits, naming the others as not this job's
    assert code == 4
    assert err[0].startswith("gpuwatch: error: 1 idle GPU wanted, 0 qualify; 1 GPU in use")
    assert err[1:4] == [
        f"  GPU {index}: not this job's GPU (Slurm gave it others)" for index in (0, 1, 2)
    ]
    assert err[4].startswith("  GPU 3: in use by bob, pid 777")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"SLURM_STEP_GPUS": "4"},
            "lists only 4 GPU File= for node node1, so GRES index 4 names no GPU",
        ),
        ({"SLURM_STEP_GPUS": "0-"}, "SLURM_STEP_GPUS='0-' is not a list of GRES indices"),
        ({"SLURM_CONF": "/nonexistent/slurm.conf"}, "cannot read /nonexistent/gres.conf"),
    ],
    ids=["index-beyond-gres-conf", "garbled-indices", "gres-conf-unreadable"],
)
def test_step_gpus_that_cannot_be_told_are_one_line_and_exit_code_2(
    step: Callable[..., Env], env: Env, message: str
) -> None:
    # GIVEN a step whose GPUs gres.conf cannot tell
    # WHEN pick runs
    code, out, err = pick({**step("0"), **env}, "--", "true")
    # THEN it says what is wrong and how to go on, in one line, with the usage exit code
    assert (code, out) == (2, "")
    assert len(err) == 1
    assert message in err[0]
    assert err[0].endswith("set GPUWATCH_IGNORE_SLURM=1 to choose as outside Slurm")


def test_a_step_gpu_the_driver_does_not_report_is_one_line_and_exit_code_2(
    step: Callable[..., Env],
) -> None:
    # GIVEN a node whose GPUs have minor numbers 0-3, and a step given /dev/nvidia7
    # WHEN pick runs
    result = run_cli("pick", "--sim", "4", env=step("0"))
    # THEN it refuses to guess
    assert result.exit_code == 2
    assert (
        result.stderr.startswith("gpuwatch: error: SLURM_STEP_GPUS=0: ")
        and "is minor number 7, but no GPU here has it" in result.stderr
    )
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    "env",
    [
        {"GPUWATCH_IGNORE_SLURM": "1"},
        {"SLURM_JOB_ID": None},
        {"SLURM_STEP_GPUS": None},
    ],
    ids=["opted-out", "outside-a-job", "a-job-without-gpus"],
)
def test_outside_a_step_with_gpus_visible_devices_alone_decides(
    step: Callable[..., Env], env: Env
) -> None:
    # GIVEN CUDA_VISIBLE_DEVICES=0, and a Slurm step that does not count
    # WHEN pick prints its choice (taking GPUs whose holders are unknown: this node's
    # Slurm has no slurmctld to answer)
    environ = {**step("0", CUDA_VISIBLE_DEVICES="0"), **env}
    code, out, err = pick(environ, "--allow-busy", "--allow-unknown-holders")
    # THEN it is NVML GPU 0, as outside Slurm
    assert (code, out) == (0, f"{UUID[4]}\n")
    assert not any("would name" in line for line in err)


def test_through_the_daemon_the_steps_gpu_is_found_by_minor_number_too(
    step: Callable[..., Env], tmp_path: Path
) -> None:
    # GIVEN a daemon serving the node, and a step given GRES 0 (/dev/nvidia7)
    with running_daemon(tmp_path, scenario=NODE.read_text()) as (_, socket_path, _):
        env = step("0", GPUWATCH_SOCKET=str(socket_path))
        # WHEN pick asks the daemon for the GPUs
        result = run_cli("pick", "--backend", "daemon", "--allow-busy", env=env)
    # THEN the snapshot it serves tells the minor numbers, and the step's GPU is chosen
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{UUID[7]}\n"


def test_on_a_node_of_mixed_models_slurms_indices_are_passed_over_silently(
    step: Callable[..., Env], tmp_path: Path
) -> None:
    # GIVEN a node of two models, where CUDA's fastest-first order cannot be told from here,
    # and a step given GRES 0 (/dev/nvidia7, NVML 3) with Slurm's CUDA_VISIBLE_DEVICES=0
    node = tmp_path / "mixed.toml"
    models = ("H100-80GB", "H100-80GB", "L4", "L4")
    node.write_text(
        "".join(
            f'[[gpu]]\nmodel = "{model}"\nuuid = "{UUID[minor]}"\nminor = {minor}\n'
            for model, minor in zip(models, (4, 5, 6, 7), strict=True)
        )
    )
    # WHEN pick prints its choice
    code, out, err = pick(step("0", CUDA_VISIBLE_DEVICES="0"), node=node)
    # THEN it is the step's GPU, with no claim about what the index would name
    assert (code, out) == (0, f"{UUID[7]}\n")
    assert not any("would name" in line or "names no GPU" in line for line in err)


def test_slurms_index_beyond_the_gpus_here_is_passed_over_in_one_line(
    step: Callable[..., Env],
) -> None:
    # GIVEN a step given GRES 0 whose CUDA_VISIBLE_DEVICES names a GPU the node lacks
    # WHEN pick prints its choice
    code, out, err = pick(step("0", CUDA_VISIBLE_DEVICES="9"))
    # THEN it is the step's GPU, and one line says the index names none here
    assert (code, out) == (0, f"{UUID[7]}\n")
    (noted,) = [line for line in err if "CUDA_VISIBLE_DEVICES=9" in line]
    assert noted.startswith(
        f"gpuwatch: CUDA_VISIBLE_DEVICES=9 names no GPU here, not this step's GPU 3 ({UUID[7]}), "
        "which SLURM_STEP_GPUS=0 names ("
    )
    assert noted.endswith("/dev/nvidia7); choosing among the step's GPUs")
