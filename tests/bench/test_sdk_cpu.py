"""``bench.sdk_cpu``: the median-round choice, and a ``--quick`` run on the real local stack whose
every case completes without errors. It never asserts a speed: the figures depend on the machine."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.sdk_cpu import median_rounds
from bench.sdk_cpu_measure import Result
from local.procs import REPO_ROOT


def test_median_rounds_keeps_each_cases_middle_round_by_cpu_per_op():
    rounds = [[Result("a", 10, 3.0, 1.0), Result("b", 10, 1.0, 1.0)],
              [Result("a", 10, 1.0, 9.0), Result("b", 10, 2.0, 2.0)],
              [Result("a", 10, 2.0, 5.0), Result("b", 10, 9.0, 3.0)]]
    a, b = median_rounds(rounds)
    assert (a.name, a.cpu_s, a.wall_s) == ("a", 2.0, 5.0)
    assert (b.name, b.cpu_s, b.wall_s) == ("b", 2.0, 2.0)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_run_measures_every_case_without_errors(tmp_path: Path) -> None:
    out = tmp_path / "sdk_cpu.json"
    proc = subprocess.run([sys.executable, "-m", "bench.sdk_cpu", "--quick", "--out", str(out)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads(out.read_text(encoding="utf-8"))
    names = [r["name"] for r in doc["results"]]
    for prefix in ("sb sync send, sequential", "sb sync send, 8 threads", "sb aio send, sequential",
                   "sb aio send, 8 tasks", "sb aio receive+complete", "tables sync get_entity",
                   "tables sync $batch rest path", "tables aio get_entity", "raw http.client get"):
        assert any(n.startswith(prefix) for n in names), (prefix, names)
    for r in doc["results"]:
        assert r["errors"] == 0 and r["ops"] == doc["ops"] and r["cpu_s"] > 0, r
    for way in doc["per_order_estimate"]["ways"].values():
        assert math.isfinite(way["total_ms"]) and way["total_ms"] > 0, way
