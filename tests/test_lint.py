"""The whole tree passes ruff, and the code (not the tests) passes mypy, as configured in
pyproject.toml (part of make test, so CI keeps it)."""

from __future__ import annotations

import subprocess
import sys

from local.procs import REPO_ROOT


def test_ruff_finds_nothing() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
