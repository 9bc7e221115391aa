"""bench.results: bench/README.md's "Results" are what the committed runs' bench.json give, and
``--write`` replaces that section alone."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from bench import results


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8")))


def test_the_readme_shows_the_committed_runs_results() -> None:
    """Regenerate with ``.venv/bin/python -m bench.results --write`` after copying a new run to bench/plots/."""
    full, smoke = load(results.FULL), load(results.SMOKE)
    shown = results.section(results.README.read_text(encoding="utf-8"))
    assert shown == results.render(full, smoke)
    # issue 43: both the full and the smoke run's cost per million orders of the default kind
    for run in (full, smoke):
        assert f"**${run['azure_cost']['default_order_usd_per_million_orders']:.2f}**" in shown


def test_write_replaces_the_section_between_the_markers_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# head\n\n{results.BEGIN}\nold figures\n{results.END}\n\ntail\n", encoding="utf-8")
    monkeypatch.setattr(results, "README", readme)
    assert results.main([str(results.FULL), "--smoke-json", "", "--write"]) == 0
    text = results.render(load(results.FULL))
    assert readme.read_text(encoding="utf-8") == f"# head\n\n{results.BEGIN}\n{text}{results.END}\n\ntail\n"
    assert results.main([str(results.FULL), "--smoke-json", ""]) == 0
    assert capsys.readouterr().out.endswith(text)


def test_a_target_not_met_and_a_missing_peer_show_as_such() -> None:
    run = copy.deepcopy(load(results.FULL))
    run["targets"][0]["met"] = False
    run["phases"]["lanes"]["target"]["normal_completes"] = False
    del run["versusTemporal"]
    text = results.render(run)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[2].endswith("| **not met** |") and run["targets"][0]["value"] in rows[2]
    assert next(r for r in rows if r.startswith("| priority lanes")).endswith("| **not met** |")
    assert "Temporal" not in text and "| measure | ours | DBOS | ours/DBOS | better |" in text
    assert "smoke," not in text  # no smoke run given: its cost row is left out
