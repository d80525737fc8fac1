"""Shared fixtures: the repository, the real `loopctl` binary, the project's own corpus."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def root() -> pathlib.Path:
    return ROOT


@pytest.fixture(scope="session")
def loopctl() -> pathlib.Path:
    """The `loopctl` binary `cargo build -p loopctl` made (or `$LOOPCTL`); missing is a failure."""
    path = pathlib.Path(os.environ.get("LOOPCTL", ROOT / "target" / "debug" / "loopctl"))
    if not path.is_file():
        pytest.fail(f"{path} is missing: build it with `cargo build -p loopctl` (scripts/test does)")
    return path


def run_loopctl(loopctl: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(loopctl), *args], capture_output=True, text=True, timeout=300)
