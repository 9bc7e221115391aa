"""Run by Python at the start of every process that has this folder on ``PYTHONPATH``.

The benchmark puts it there for the local host's processes only (``bench.opcount.host_env``),
to count their Table Storage requests from outside the app. It loads ``bench/opcount.py`` by
its path (the app's folder is not on ``sys.path`` yet) and switches counting on if
``BENCH_OPCOUNT_DIR`` is set; a failure is reported on stderr and the process runs uncounted.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path


def _load(name: str) -> object:
    path = Path(__file__).resolve().parent.parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _install_counting() -> None:
    directory = os.environ.get("BENCH_OPCOUNT_DIR")
    if not directory:
        return
    try:
        _load("opcount").install()  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001 - the benchmark's counter must never stop the process
        print(f"bench: table requests of pid {os.getpid()} are not counted: {e!r}", file=sys.stderr)


_install_counting()
