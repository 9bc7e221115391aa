"""``python -m bench.hop`` on the real emulator: both receive patterns run and every hop is counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import hop

pytestmark = pytest.mark.integration


def test_hop_runs_both_patterns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "hop.json"
    assert hop.main(["--messages", "15", "--rounds", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text(encoding="utf-8"))
    assert [r["pattern"] for r in data["runs"]] == ["concurrent", "turns"]
    for r in data["runs"]:
        assert r["hops"] == 15  # every message sent was handled once
        assert 0 < r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] <= r["max_ms"]
    assert data["slots"] == 4  # host.json's maxConcurrentCalls
    assert "turns: 15 hops" in capsys.readouterr().out
