"""The same-run A/B (bench.ab) without any stack: bench.json parsing, the ratios, the ABBA order,
and that the baseline worktree goes away after a failed run. The bench runs are faked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench import ab
from bench.cpu_split import CONTROL


def fake_bench_json(app_code: float = 26.7, with_control: bool = True) -> dict[str, Any]:
    """The keys bench/run.py, bench/cpu_split.py, bench/cost.py and bench/report.py write."""
    split: dict[str, Any] = {"app_code": app_code, "host_loop": 9.1, "host_other_threads": 1.2,
                             "other_processes": {"azurite": 12.0, CONTROL: 4.2}, "other_processes_total": 16.2,
                             "orders": 400}
    if with_control:
        split["app_code_over_control"] = round(app_code / 4.2, 2)
    return {"phases": {"saturation": {"processed": 400, "orders_per_s": 24.0, "steady": {"orders_per_s": 25.7},
                                      "cpu_ms_per_order_split": split}},
            "cost_at_saturation": {"requests_per_order": 4.361},
            "where_time_goes": {"cpu_ms_per_order": {"host instances (the app)": 37.0, "azurite": 12.0}}}


def test_figures_of_a_bench_json() -> None:
    f = ab.figures_of(fake_bench_json())
    assert f == {"app_code_ms": 26.7, "host_loop_ms": 9.1, "host_other_threads_ms": 1.2, "host_instances_ms": 37.0,
                 "control_ms": 4.2, "app_over_control": 6.36, "table_requests_per_order": 4.361,
                 "orders_per_s": 25.7}


def test_keys_an_older_bench_json_lacks_are_missing_not_an_error(tmp_path: Path) -> None:
    old = fake_bench_json(with_control=False)
    del old["where_time_goes"]
    f = ab.figures_of(old)
    assert f["app_over_control"] is None and f["host_instances_ms"] is None and f["app_code_ms"] == 26.7
    assert ab.read_figures(tmp_path / "absent.json") == dict.fromkeys(ab.FIGURES)
    assert ab.fmt(None) == "missing"


def test_ratios_and_their_spread() -> None:
    assert ab.ratio(27.0, 30.0) == 0.9
    assert ab.ratio(None, 30.0) is None and ab.ratio(27.0, None) is None and ab.ratio(27.0, 0.0) is None
    r = ab.pair_ratios(ab.figures_of(fake_bench_json(30.0)), ab.figures_of(fake_bench_json(27.0)))
    assert r["app_code_ms"] == 0.9 and r["host_loop_ms"] == 1.0
    assert ab.spread([1.1, None, 0.9, 1.0]) == {"n": 3, "median": 1.0, "min": 0.9, "max": 1.1}
    assert ab.spread([0.9, 1.0])["median"] == 0.95
    assert ab.spread([None]) == {"n": 0, "median": None, "min": None, "max": None}


def test_pairs_alternate_which_tree_goes_first() -> None:
    assert [ab.pair_order(k) for k in (1, 2, 3, 4)] == [("baseline", "current"), ("current", "baseline")] * 2


def test_bench_command_keeps_the_saturation_it_is_given() -> None:
    opts, extra = ab.parse_args(["--baseline", "HEAD", "--saturation-seconds", "20", "--keep"])
    cmd = ab.bench_command(Path("/tmp/run"), opts, extra)
    assert "--smoke" not in cmd  # it would cap the saturation at 5 s and the window at 6
    assert cmd[cmd.index("--saturation-seconds") + 1] == "20" and cmd[cmd.index("--window") + 1] == "12"
    assert cmd[-1] == "--keep" and cmd[cmd.index("--out-dir") + 1] == "/tmp/run"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A one-commit git repository standing in for the app's."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "app.py").write_text("x = 1\n")
    env = ["-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "app.py"], [*env, "commit", "-q", "-m", "one"]):
        subprocess.run(["git", *cmd], cwd=root, check=True, capture_output=True)
    return root


def worktrees(repo: Path) -> list[str]:
    out = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=repo, check=True, capture_output=True,
                         text=True).stdout
    return [line for line in out.splitlines() if line.startswith("worktree ")]


class FakeBench:
    """Stands in for ``run_bench``: records each call and writes a bench.json (or fails)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[tuple[Path, list[str]]] = []
        self.fail_at = fail_at
        self.baseline_checked_out: list[bool] = []  # the commit's files and node_modules linked, while it runs

    def __call__(self, cmd: list[str], cwd: Path, log_path: Path) -> int:
        self.calls.append((cwd, cmd))
        if cwd.name == "baseline":
            self.baseline_checked_out.append((cwd / "app.py").exists() and (cwd / "node_modules").is_symlink())
        log_path.write_text("line 1\nthe failing line\n")
        if len(self.calls) == self.fail_at:
            return 1
        app_code = 30.0 if cwd.name == "baseline" else 27.0
        out = Path(cmd[cmd.index("--out-dir") + 1])
        (out / "bench.json").write_text(json.dumps(fake_bench_json(app_code)))
        return 0


def test_a_full_ab_in_abba_order_writes_its_results(repo: Path, tmp_path: Path) -> None:
    bench = FakeBench()
    out = tmp_path / "out"
    code = ab.run_ab(["--baseline", "HEAD", "--pairs", "2", "--out-dir", str(out)], repo=repo, runner=bench)
    assert code == 0
    trees = ["baseline" if cwd.name == "baseline" else "current" for cwd, _ in bench.calls]
    assert trees == ["baseline", "current", "current", "baseline"]
    assert bench.baseline_checked_out == [True, True]
    doc = json.loads((out / "ab.json").read_text())
    assert doc["completed"] and doc["baseline_commit"] == doc["current_head"] and len(doc["runs"]) == 4
    assert doc["summary"]["app_code_ms"] == {"n": 2, "median": 0.9, "min": 0.9, "max": 0.9}
    assert (out / "ab.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(worktrees(repo)) == 1


def test_a_failed_run_stops_the_ab_and_removes_the_worktree(repo: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    bench = FakeBench(fail_at=1)
    out = tmp_path / "out"
    code = ab.run_ab(["--baseline", "HEAD", "--pairs", "3", "--out-dir", str(out)], repo=repo, runner=bench)
    assert code == 1 and len(bench.calls) == 1
    assert "the failing line" in capsys.readouterr().out
    assert len(worktrees(repo)) == 1 and not bench.calls[0][0].exists()
    assert json.loads((out / "ab.json").read_text())["completed"] is False


def test_current_may_be_a_commit_of_its_own_so_the_tree_can_change_meanwhile(repo: Path, tmp_path: Path) -> None:
    bench = FakeBench()
    (repo / "app.py").write_text("x = 2  # an edit made while the A/B runs\n")
    code = ab.run_ab(["--baseline", "HEAD", "--current", "HEAD", "--pairs", "1", "--out-dir", str(tmp_path / "o")],
                     repo=repo, runner=bench)
    assert code == 0
    current = [cwd for cwd, _ in bench.calls if cwd.name == "current"]
    assert len(current) == 1 and current[0] != repo  # a worktree of the commit, not the edited tree
    doc = json.loads((tmp_path / "o" / "ab.json").read_text())
    assert doc["current_ref"] == "HEAD" and doc["current_dirty"] is False
    assert len(worktrees(repo)) == 1 and not current[0].exists()
