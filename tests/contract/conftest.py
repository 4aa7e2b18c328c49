"""Fixtures of the end-to-end contract tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.fakenvml import FAKENVML


@pytest.fixture(scope="module")
def library_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("fakenvml")
    subprocess.run(
        ["make", "-s", "-C", str(FAKENVML), f"BUILD={build}"], check=True, capture_output=True
    )
    return build
