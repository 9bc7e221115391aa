"""The whole tree passes ruff, as configured in pyproject.toml (part of make test, so CI keeps it)."""

from __future__ import annotations

import subprocess
import sys

from local.procs import REPO_ROOT


def test_ruff_finds_nothing() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
