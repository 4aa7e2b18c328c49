"""The GPU order real `slurmd -G` reports for a gres.conf, on this machine: the oracle of the
gres.conf tests. Nothing runs but `slurmd -G` (it prints the node's GRES as slurmd merged
them, and exits): no munge, no slurmctld.

The configuration lives in a folder of its own: slurm.conf defining one node, the gres.conf
given (with `/dev/` turned into the folder's own `dev/`, where every device file it names is
made with `mknod`), the files it includes, and, for an `AutoDetect` layout, a
`fake_gpus.conf`: slurmd's own stand-in for detection (`_get_system_gpu_list_fake`), whose
lines play NVML's GPUs in NVML's order.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

NVIDIA_MAJOR = 195
_GRES_LINE = re.compile(
    r"Gres Name=(\S+) Type=(\S+) Count=(\d+) (?:Index=\d+ )?ID=\d+(?: File=(\S+))?"
)


@dataclass(frozen=True)
class SlurmdGpu:
    """One GRES index as slurmd reports it: its files (several for a MIG device)."""

    files: tuple[str, ...]
    type_name: str | None


def why_not() -> str | None:
    """Why `slurmd -G` cannot run here, or `None`."""
    if shutil.which("slurmd", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") is None:
        return "slurmd is not installed (apt-get install slurmd)"
    if os.geteuid() != 0:
        return "device files for slurmd are made with mknod, which needs root"
    return None


def local_text(text: str, root: Path) -> str:
    """`text` with /dev/ paths moved under `root`/dev/."""
    return text.replace("/dev/", f"{root}/dev/")


def write_config(
    root: Path,
    gres_conf: str,
    *,
    node: str,
    gres: str,
    includes: Mapping[str, str] | None = None,
    detected: Sequence[tuple[str, str]] | None = None,
) -> Path:
    """Writes slurm.conf (node `node` with `Gres=gres`), gres.conf, `includes` (relative
    path: text) and, when `detected` ((device file, type) in NVML's order) is given, a
    fake_gpus.conf; makes every device file named. Returns slurm.conf's path."""
    (root / "dev").mkdir(exist_ok=True)
    (root / "spool").mkdir(exist_ok=True)
    slurm_conf = root / "slurm.conf"
    texts = {"gres.conf": gres_conf, **(includes or {})}
    named = {
        name.lower() for text in texts.values() for name in re.findall(r"(?i)\bname=(\w+)", text)
    }
    gres_types = ",".join(["gpu", *sorted(named - {"gpu"})])
    slurm_conf.write_text(
        f"ClusterName=gres\nSlurmctldHost=localhost\nSlurmUser=root\n"
        f"SlurmdSpoolDir={root}/spool\nSlurmdLogFile={root}/slurmd.log\n"
        f"GresTypes={gres_types}\nProctrackType=proctrack/linuxproc\n"
        "TaskPlugin=task/none\nSelectType=select/cons_tres\n"
        "SlurmdParameters=config_overrides\n"
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs=256 Gres={gres} State=UNKNOWN\n"
        f"PartitionName=test Nodes={node} Default=YES\n"
    )
    for name, text in texts.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(local_text(text, root))
        _make_devices(path.read_text(), root, slurm_conf)
    if detected is not None:
        lines = []
        for position, (file, type_name) in enumerate(detected):
            links = ",".join("-1" if i == position else "0" for i in range(len(detected)))
            lines.append(f"{type_name}|1|0|{links}|{local_text(file, root)}")
        (root / "fake_gpus.conf").write_text("\n".join(lines) + "\n")
        _make_devices((root / "fake_gpus.conf").read_text(), root, slurm_conf)
    return slurm_conf


def _make_devices(text: str, root: Path, slurm_conf: Path) -> None:
    """Every device file `text` names under `root`/dev/ (hostlists expanded by Slurm's own
    `scontrol show hostnames`), as a character device: /dev/nvidiaN has minor N."""
    prefix = re.escape(f"{root}/dev/")
    for expression in set(re.findall(rf"{prefix}[^\s|]+", text)):
        for name in hostnames(expression, slurm_conf):
            path = Path(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            digits = re.search(r"(\d+)$", path.name)
            if not path.exists():
                os.mknod(
                    path,
                    0o600 | 0o020000,
                    os.makedev(NVIDIA_MAJOR, int(digits.group(1)) if digits else 255),
                )


def slurmd_gpus(slurm_conf: Path, node: str) -> list[SlurmdGpu]:
    """The GPUs `slurmd -G` reports for `node`, one per GRES index, in index order."""
    done = subprocess.run(
        ["slurmd", "-G", "-f", str(slurm_conf), "-N", node],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": f"{os.environ.get('PATH', '')}:/usr/sbin"},
    )
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"slurmd -G failed ({done.returncode}):\n{output}")
    gpus: list[SlurmdGpu] = []
    for name, type_name, count, files in _GRES_LINE.findall(output):
        if name.lower() != "gpu" or not files or int(count) == 0:
            continue
        names = hostnames(files, slurm_conf)
        kind = None if type_name == "(null)" else type_name
        if int(count) == 1 and len(names) > 1:
            gpus.append(SlurmdGpu(tuple(names), kind))
        else:
            gpus.extend(SlurmdGpu((file,), kind) for file in names)
    return gpus


def hostnames(expression: str, slurm_conf: Path) -> list[str]:
    """Slurm's own expansion of a hostlist (`scontrol show hostnames`)."""
    return subprocess.run(
        ["scontrol", "show", "hostnames", expression],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "SLURM_CONF": str(slurm_conf)},
    ).stdout.split()
