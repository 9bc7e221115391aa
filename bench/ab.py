"""Same-run A/B: the app's CPU per order of the working tree against a baseline commit.

``python -m bench.ab --baseline REF [--pairs N] [--out-dir DIR] [bench options...]``

This machine's speed moves by up to 2x within minutes, so a code change is measured against its
baseline in the same run: a reduced bench on each tree, in N pairs whose order alternates (AB BA
AB ...), the baseline from a detached ``git worktree`` of REF (removed at the end, whatever
happens). Each pair gives ratios current/baseline of the saturation phase's app code, host loop,
host instances and the bench process's own CPU per order (the machine-speed control), table
requests per order and orders/s; the result is their median. Nothing is asserted on speed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.cpu_split import CONTROL
from bench.figures import pyplot, save
from bench.logline import log
from local.procs import REPO_ROOT

DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "ab"
TREES = ("baseline", "current")
SPLIT = ("phases", "saturation", "cpu_ms_per_order_split")
# figure -> (its path in bench.json, its printed label)
FIGURES: dict[str, tuple[tuple[str, ...], str]] = {
    "app_code_ms": ((*SPLIT, "app_code"), "app code CPU ms/order"),
    "host_loop_ms": ((*SPLIT, "host_loop"), "host receive/settle loop ms/order"),
    "host_other_threads_ms": ((*SPLIT, "host_other_threads"), "other host threads ms/order"),
    "host_instances_ms": (("where_time_goes", "cpu_ms_per_order", "host instances (the app)"),
                          "host instances, whole, ms/order"),
    "control_ms": ((*SPLIT, "other_processes", CONTROL), "bench process (control) ms/order"),
    "app_over_control": ((*SPLIT, "app_code_over_control"), "app code / control"),
    "table_requests_per_order": (("cost_at_saturation", "requests_per_order"), "table requests/order"),
    "orders_per_s": (("phases", "saturation", "steady", "orders_per_s"), "orders/s (steady)"),
}
# --smoke caps --saturation-seconds at 5 and --window at 6 (bench/args.py), so its other sizes are
# given explicitly instead; the phases that do not bear on the saturation figures are left out
SMALL_RUN = ["--skip-emulator", "--skip-peer", "--search-sizes", "", "--lanes-seconds", "0", "--skip-recovery",
             "--no-plots", "--no-profile", "--sweep-small", "50",
             "--sweep-large", "100", "--leftover", "5", "--warmup", "3", "--latency-seconds", "4",
             "--sustained-seconds", "0", "--idle-seconds", "6", "--supervisor-period", "2", "--step-timeout", "6",
             "--bulk-orders", "0"]
STOP_GRACE_S = 180  # an interrupted bench stops its stack and writes bench.json first


@dataclass
class Run:
    pair: int  # 1-based
    tree: str  # "baseline" or "current"
    seconds: float
    log: str
    exit_code: int
    figures: dict[str, float | None]
    tree_digest: str | None = None  # the current tree's HEAD and uncommitted changes at the run's start


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The A/B's own options; everything else is passed on to ``python -m bench`` for both trees."""
    ap = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="the git ref to compare against (e.g. HEAD, main~1)")
    ap.add_argument("--current", default=None,
                    help="measure this git ref (a worktree of its own) instead of the working tree as it is at each "
                         "run, so that the tree can be edited while the A/B runs")
    ap.add_argument("--pairs", type=int, default=3, help="pairs of runs (baseline + current each)")
    ap.add_argument("--out-dir", default=str(DEFAULT_OUT))
    ap.add_argument("--saturation-seconds", type=float, default=15.0)
    ap.add_argument("--window", type=int, default=12, help="orders in flight at saturation")
    return ap.parse_known_args(argv)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def tree_digest(repo: Path) -> str:
    """The working tree's HEAD and a digest of its uncommitted changes to tracked files: other
    people may commit or edit while the A/B runs, and each current run measures what is there."""
    diff = git(repo, "diff", "HEAD", "--binary")
    return f"{git(repo, 'rev-parse', '--short=10', 'HEAD')}+{hashlib.sha256(diff.encode()).hexdigest()[:10]}"


def commit_of(repo: Path, ref: str) -> str:
    return git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}")


def trees_state(repo: Path, ref: str, current: str | None = None) -> dict[str, Any]:
    if current is not None:
        return {"baseline_ref": ref, "baseline_commit": commit_of(repo, ref), "current_ref": current,
                "current_head": commit_of(repo, current), "current_dirty": False}
    return {"baseline_ref": ref, "baseline_commit": commit_of(repo, ref),
            "current_head": git(repo, "rev-parse", "HEAD"), "current_dirty": bool(git(repo, "status", "--porcelain"))}


@contextmanager
def baseline_worktree(repo: Path, commit: str, name: str = "baseline") -> Iterator[Path]:
    """A detached worktree of ``commit`` in a temporary folder, with the repo's node_modules
    (Azurite) linked in; removed on the way out, whatever happened."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-ab-"))
    tree = tmp / name
    try:
        git(repo, "worktree", "add", "--detach", str(tree), commit)
        (tree / "node_modules").symlink_to(repo / "node_modules")
        yield tree
    finally:
        if tree.exists():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=repo, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def current_tree(repo: Path, ref: str | None) -> Iterator[Path]:
    """The tree measured as "current": the repo itself, or a worktree of ``ref``."""
    if ref is None:
        yield repo
        return
    with baseline_worktree(repo, commit_of(repo, ref), name="current") as tree:
        yield tree


def pair_order(pair: int) -> tuple[str, str]:
    """Which tree runs first in pair ``pair`` (1-based): AB, BA, AB, ..."""
    return ("baseline", "current") if pair % 2 else ("current", "baseline")


def bench_command(out_dir: Path, opts: argparse.Namespace, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "bench", *SMALL_RUN, "--saturation-seconds", f"{opts.saturation_seconds:g}",
            "--window", str(opts.window), "--out-dir", str(out_dir), *extra]


def run_bench(cmd: list[str], cwd: Path, log_path: Path) -> int:
    """Run one bench with its output to ``log_path``; if interrupted, let it stop its stack first."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the tree's own code, not another's
    with log_path.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                env=env | {"PYTHONUNBUFFERED": "1"})
        try:
            return proc.wait()
        except BaseException:
            stop_child(proc)
            raise


def stop_child(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def dig(doc: Any, path: tuple[str, ...]) -> float | None:
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return float(doc) if isinstance(doc, int | float) and not isinstance(doc, bool) else None


def figures_of(result: dict[str, Any]) -> dict[str, float | None]:
    """The saturation figures of one bench.json; a key an older bench does not write is None."""
    return {name: dig(result, path) for name, (path, _) in FIGURES.items()}


def read_figures(bench_json: Path) -> dict[str, float | None]:
    try:
        return figures_of(json.loads(bench_json.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return dict.fromkeys(FIGURES)


def ratio(current: float | None, baseline: float | None) -> float | None:
    return round(current / baseline, 4) if current is not None and baseline else None


def pair_ratios(base: dict[str, float | None], cur: dict[str, float | None]) -> dict[str, float | None]:
    return {name: ratio(cur.get(name), base.get(name)) for name in FIGURES}


def spread(values: list[float | None]) -> dict[str, Any]:
    """Median, min and max of the values present."""
    xs = [x for x in values if x is not None]
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {"n": len(xs), "median": round(statistics.median(xs), 4), "min": min(xs), "max": max(xs)}


def fmt(x: float | None) -> str:
    return "missing" if x is None else f"{x:g}"


def table(pair: int, base: Run, cur: Run, ratios: dict[str, float | None]) -> str:
    first = pair_order(pair)[0]
    lines = [f"pair {pair} ({first} first; {base.seconds:.0f} s + {cur.seconds:.0f} s)",
             f"  {'':36}{'baseline':>10}{'current':>10}{'cur/base':>10}"]
    for name, (_, label) in FIGURES.items():
        lines.append(f"  {label:36}{fmt(base.figures[name]):>10}{fmt(cur.figures[name]):>10}"
                     f"{fmt(ratios[name]):>10}")
    return "\n".join(lines)


def plot(runs: list[Run], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for tree, dx, marker in (("baseline", -0.08, "o"), ("current", 0.08, "s")):
        pts = [(r.pair + dx, y) for r in runs if r.tree == tree and (y := r.figures["app_code_ms"]) is not None]
        ax.scatter([x for x, _ in pts], [y for _, y in pts], marker=marker, label=tree)
    pairs = sorted({r.pair for r in runs})
    ax.set_xticks(pairs)
    ax.set_xlim(0.5, pairs[-1] + 0.5)
    ax.set_xlabel("pair")
    ax.set_ylabel("app code CPU ms per order (saturation)")
    ax.set_title("Same-run A/B: app code CPU per order")
    ax.legend()
    save(fig, path, dpi=100)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def measure(trees: dict[str, Path], opts: argparse.Namespace, extra: list[str], out_dir: Path,
            runs: list[Run], runner: Callable[[list[str], Path, Path], int] = run_bench) -> bool:
    """The pairs, each tree once per pair in ABBA order; False at the first failed run."""
    for pair in range(1, opts.pairs + 1):
        for tree in pair_order(pair):
            run_dir = out_dir / "runs" / f"pair{pair}-{tree}"
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "bench.json").unlink(missing_ok=True)
            log_path = run_dir / "bench.log"
            digest = tree_digest(trees["current"]) if tree == "current" else None
            t0 = time.monotonic()
            code = runner(bench_command(run_dir, opts, extra), trees[tree], log_path)
            run = Run(pair, tree, round(time.monotonic() - t0, 1), str(log_path), code,
                      read_figures(run_dir / "bench.json"), digest)
            runs.append(run)
            log(f"{tree:8} pair {pair} of {opts.pairs}: {run.seconds:.0f} s, app code "
                f"{fmt(run.figures['app_code_ms'])} ms per order" + (f", EXIT {code}" if code else ""))
            if code:
                print(f"--- the last lines of {log_path} ---\n{tail(log_path)}", flush=True)
                return False
    return True


def report(runs: list[Run]) -> dict[str, Any]:
    """Print each pair's table and the median ratios; the pairs' ratios and their spread."""
    by = {(r.pair, r.tree): r for r in runs}
    pairs: list[dict[str, Any]] = []
    for pair in sorted({r.pair for r in runs}):
        base, cur = by.get((pair, "baseline")), by.get((pair, "current"))
        if base is None or cur is None:
            continue
        ratios = pair_ratios(base.figures, cur.figures)
        print(table(pair, base, cur, ratios), flush=True)
        pairs.append({"pair": pair, "first": pair_order(pair)[0], "ratios": ratios})
    summary = {name: spread([p["ratios"][name] for p in pairs]) for name in ("app_code_ms", "app_over_control")}
    for name, s in summary.items():
        print(f"{FIGURES[name][1]}, current/baseline over {s['n']} pair(s): median {fmt(s['median'])} "
              f"(min {fmt(s['min'])}, max {fmt(s['max'])})", flush=True)
    if len({r.tree_digest for r in runs if r.tree == "current"}) > 1:
        print("note: the working tree changed during the A/B (tree_digest per run in ab.json)", flush=True)
    return {"pairs": pairs, "summary": summary}


def run_ab(argv: list[str] | None = None, repo: Path = REPO_ROOT,
           runner: Callable[[list[str], Path, Path], int] = run_bench) -> int:
    opts, extra = parse_args(argv)
    out_dir = Path(opts.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    load = round(os.getloadavg()[0], 2)
    try:
        state = trees_state(repo, opts.baseline, opts.current)
    except subprocess.CalledProcessError as e:
        log(f"git {' '.join(e.cmd[1:])} failed: {e.stderr.strip()}")
        return 2
    doc: dict[str, Any] = {"loadavg_1m_at_start": load, **state, "pairs_asked": opts.pairs,
                           "bench_command": bench_command(Path("<run dir>"), opts, extra)}
    against = (f"{opts.current} = {doc['current_head'][:10]}" if opts.current else
               f"the working tree (HEAD {doc['current_head'][:10]}{', dirty' if doc['current_dirty'] else ''})")
    log(f"A/B: baseline {opts.baseline} = {doc['baseline_commit'][:10]} against {against}; {opts.pairs} pair(s); "
        f"logs under {out_dir / 'runs'}")
    runs: list[Run] = []
    ok = interrupted = False
    try:
        with baseline_worktree(repo, doc["baseline_commit"]) as base_tree, current_tree(repo, opts.current) as cur:
            ok = measure({"baseline": base_tree, "current": cur}, opts, extra, out_dir, runs, runner)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted; the baseline worktree is removed")
    doc |= {"completed": ok, "interrupted": interrupted, "runs": [asdict(r) for r in runs], **report(runs)}
    (out_dir / "ab.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if runs:
        plot(runs, out_dir / "ab.png")
    log(f"wrote {out_dir / 'ab.json'}" + (f" and {out_dir / 'ab.png'}" if runs else ""))
    return 130 if interrupted else 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    def on_term(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    return run_ab(argv)


if __name__ == "__main__":
    sys.exit(main())
