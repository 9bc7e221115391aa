"""checkov (PyPI, pinned) parses every Bicep file of infra/ and finds no unsuppressed issue.

checkov exits 0 when it cannot parse a file, so the report's `parsing_errors` is what tells a
broken template apart; the negative test proves that this check fails on a broken file.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from .conftest import INFRA, VENV_TIMEOUT, bicep_files, run_checkov

pytestmark = pytest.mark.timeout(VENV_TIMEOUT)


def declared_resources() -> int:
    """Resources the templates deploy (`existing` references and modules not counted)."""
    count = 0
    for path in bicep_files():
        for line in path.read_text().splitlines():
            if re.match(r"resource \w+ '[^']+' (?!existing)", line):
                count += 1
    return count


@pytest.fixture(scope="module")
def report(checkov_bin: Path) -> dict:
    return run_checkov(checkov_bin, INFRA)


def test_no_parsing_errors(report: dict) -> None:
    assert report["results"]["parsing_errors"] == []
    assert report["summary"]["parsing_errors"] == 0


def test_every_resource_was_parsed(report: dict) -> None:
    summary = report["summary"]
    assert summary["checkov_version"] == "3.3.30"
    assert summary["resource_count"] >= declared_resources() >= 20, summary
    assert summary["passed"] >= 15, summary
    checked = {c["resource"].rsplit(".", 1)[0] for kind in ("passed_checks", "skipped_checks")
               for c in report["results"][kind]}
    for resource_type in ("Microsoft.Web/sites", "Microsoft.Web/serverfarms", "Microsoft.Storage/storageAccounts",
                          "Microsoft.Storage/storageAccounts/blobServices/containers"):
        assert resource_type in checked, f"checkov checked no {resource_type}: {sorted(checked)}"
    checked_files = {Path(c["file_path"]).name for kind in ("passed_checks", "skipped_checks", "failed_checks")
                     for c in report["results"][kind]}
    assert {"functionapp.bicep", "storage.bicep"} <= checked_files


def test_no_failed_check(report: dict) -> None:
    failed = [f"{c['check_id']} {c['resource']} ({c['file_path']}:{c['file_line_range']}): {c['check_name']}"
              for c in report["results"]["failed_checks"]]
    assert failed == [], "fix these, or suppress inline with a reason:\n" + "\n".join(failed)


def test_every_suppression_has_a_reason(report: dict) -> None:
    for check in report["results"]["skipped_checks"]:
        reason = (check["check_result"].get("suppress_comment") or "").strip()
        assert len(reason) > 20 and reason != "No comment provided", check["check_id"]
    # And every inline suppression in the files suppresses a check that runs (no stale ones).
    written = {(m.group(1), path.name) for path in bicep_files()
               for m in re.finditer(r"//\s*checkov:skip=(CKV\w+):", path.read_text())}
    used = {(c["check_id"], Path(c["file_path"]).name) for c in report["results"]["skipped_checks"]}
    assert written == used


def test_a_broken_template_is_reported_as_a_parsing_error(checkov_bin: Path, tmp_path: Path) -> None:
    broken = tmp_path / "infra"
    shutil.copytree(INFRA, broken)
    main = broken / "main.bicep"
    text = main.read_text()
    # Drop the closing brace of the first module: a syntax error a Bicep compiler rejects too.
    cut = text.index("\n}\n", text.index("module identity"))
    main.write_text(text[:cut] + "\n" + text[cut + 3:])
    report = run_checkov(checkov_bin, broken)
    errors = report["results"]["parsing_errors"]
    assert [Path(e).name for e in errors] == ["main.bicep"], errors
