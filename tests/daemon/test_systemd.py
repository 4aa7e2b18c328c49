"""The systemd unit is valid, and asks for what the daemon does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatch.paths import SYSTEM_DIR
from gpuwatch.paths import SYSTEM_LEASE_DIR as LEASES

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "gpuwatch.service"
TMPFILES = UNIT.with_name("gpuwatch.tmpfiles.conf")


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("GPUWATCH_REQUIRE_SYSTEMD"):
            pytest.fail("systemd-analyze is required here (GPUWATCH_REQUIRE_SYSTEMD is set)")
        pytest.skip("systemd-analyze is not installed")
    # verify insists that ExecStart's program exists: point it at the gpuwatch installed here.
    gpuwatch = shutil.which("gpuwatch") or str(Path(sys.executable).with_name("gpuwatch"))
    unit = tmp_path / "gpuwatch.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/gpuwatch", gpuwatch))
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "gpuwatch.service" not in result.stderr, result.stderr


def test_unit_is_a_notify_service_with_a_watchdog_and_a_private_runtime_directory() -> None:
    settings = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            settings.setdefault(key, value)
    assert settings["Type"] == "notify" and settings["Restart"] == "on-failure"
    assert int(settings["WatchdogSec"]) > 0
    assert settings["RuntimeDirectory"] == "gpuwatch"
    assert settings["RuntimeDirectoryMode"] == "0755", "nobody but the daemon writes there"
    assert settings["ExecStartPre"].endswith("install -d -m 1777 -o root -g root " + LEASES)
    assert settings["RuntimeDirectoryPreserve"] == "yes", "leases outlive daemon restarts"
    assert settings["ProtectSystem"] == "strict" and settings["NoNewPrivileges"] == "yes"
    assert settings["User"] == "gpuwatch"
    assert "--socket /run/gpuwatch/gpuwatch.sock" in settings["ExecStart"]


def test_tmpfiles_make_a_private_socket_directory_and_a_shared_lease_directory(
    tmp_path: Path,
) -> None:
    tmpfiles = shutil.which("systemd-tmpfiles")
    if tmpfiles is None:
        pytest.skip("systemd-tmpfiles is not installed")
    # GIVEN a machine whose /run/gpuwatch was left world-writable by an older unit
    (tmp_path / "run" / "gpuwatch").mkdir(parents=True)
    (tmp_path / "run" / "gpuwatch").chmod(0o1777)
    # WHEN tmpfiles runs (at boot, or by hand after an upgrade)
    subprocess.run(
        [tmpfiles, "--create", f"--root={tmp_path}", str(TMPFILES)], check=True, timeout=60
    )
    # THEN only its owner may write the socket's directory, and everyone the leases'
    assert (tmp_path / SYSTEM_DIR[1:]).stat().st_mode & 0o7777 == 0o755
    assert (tmp_path / LEASES[1:]).stat().st_mode & 0o7777 == 0o1777
