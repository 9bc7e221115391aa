"""The peer's own venv, ``.venv-peer`` (git-ignored by ``.venv-*``), built on first use.

DBOS and its dependencies (SQLAlchemy, psycopg, ...) stay out of the app's venv: the peer runs as
a subprocess with this venv's python. Same pattern as tests/infra/conftest.py's ``ensure_venv``: a
lock across concurrent builders, and a stamp (the hash of the pinned requirements and the pip
version) written only once the install completed, so a half-built venv is rebuilt. Standard
library only: the runner and the smoke test import it from the app's venv.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PEER_VENV = REPO_ROOT / ".venv-peer"
REQUIREMENTS = Path(__file__).resolve().parent / "requirements.txt"
PIP_VERSION = "26.3"  # a recent pip first: the venv module's bundled one is old
_PIP_QUIET = ["--quiet", "--disable-pip-version-check", "--no-input"]


def peer_python(venv: Path = PEER_VENV) -> Path:
    return venv / "bin" / "python"


def _stamp_value(requirements: Path = REQUIREMENTS) -> str:
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    return f"pip {PIP_VERSION}; requirements.txt sha256 {digest}"


@contextlib.contextmanager
def _locked(venv: Path) -> Iterator[None]:
    """One builder per venv at a time, across concurrent processes."""
    key = hashlib.sha256(str(venv).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"venv-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_peer_venv(venv: Path = PEER_VENV, log: bool = True,
                     requirements: Path = REQUIREMENTS) -> tuple[Path, float]:
    """(the venv's python, seconds spent building it: 0.0 when it was already up to date). The
    Temporal peer builds its own (``.venv-temporal``) from its requirements with the same code."""
    stamp = venv / ".installed"
    python = peer_python(venv)
    want = _stamp_value(requirements)
    with _locked(venv):
        if python.exists() and stamp.exists() and stamp.read_text().strip() == want:
            return python, 0.0
        t0 = time.monotonic()
        if log:
            print(f"building {venv} from {requirements.relative_to(REPO_ROOT)} (first use)", flush=True)
        if venv.exists():
            shutil.rmtree(venv)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", *_PIP_QUIET, f"pip=={PIP_VERSION}"], check=True)
        subprocess.run([str(python), "-m", "pip", "install", *_PIP_QUIET, "-r", str(requirements)], check=True)
        stamp.write_text(want + "\n")
        seconds = time.monotonic() - t0
        if log:
            print(f"built {venv} in {seconds:.1f}s", flush=True)
        return python, seconds
