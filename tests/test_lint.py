"""The whole tree passes ruff, the code (not the tests) passes mypy, shared/ keeps its layers and no
package has an import cycle (import-linter's contracts), as configured in pyproject.toml (part of make
test, so CI keeps them)."""

from __future__ import annotations

import subprocess
import sys

from local.procs import REPO_ROOT


def test_ruff_finds_nothing() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing() -> None:
    """With the repository's own cache (.mypy_cache, git-ignored): a second run checks only what
    changed (about 3 s instead of 40 here), and mypy keeps the cache right across edits."""
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_layers_of_shared_hold(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """import-linter: the pure core imports nothing outside it, storage never imports the console or
    the API, the layers import downwards only, no import cycle exists anywhere in shared/, bench/,
    local/ or functions/ nor between them, and the app never imports the benchmarks or the local stack."""
    lint = REPO_ROOT / ".venv" / "bin" / "lint-imports"
    command = [str(lint)] if lint.exists() else [sys.executable, "-m", "importlinter.cli"]
    result = subprocess.run([*command, "--cache-dir", str(tmp_path / "cache")], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "7 kept, 0 broken" in result.stdout, result.stdout
