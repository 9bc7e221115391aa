"""The Temporal peer's own venv, ``.venv-temporal`` (git-ignored by ``.venv-*``), built on first
use by the DBOS peer's builder (a lock across builders, a stamp of the pinned requirements).
Standard library only: the runner and the smoke test import it from the app's venv."""

from __future__ import annotations

from pathlib import Path

from bench.peer_dbos.venv import REPO_ROOT, ensure_peer_venv

TEMPORAL_VENV = REPO_ROOT / ".venv-temporal"
REQUIREMENTS = Path(__file__).resolve().parent / "requirements.txt"


def ensure_temporal_venv(log: bool = True) -> tuple[Path, float]:
    """(the venv's python, seconds spent building it: 0.0 when it was already up to date)."""
    return ensure_peer_venv(TEMPORAL_VENV, log=log, requirements=REQUIREMENTS)
