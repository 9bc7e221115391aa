"""The benchmark's command line (``python -m bench --help``), and the ``--smoke`` sizes for CI."""

from __future__ import annotations

import argparse

from bench import versus
from local.procs import REPO_ROOT
from shared.observability.sampling import DEFAULT_RATIO

RESULTS = REPO_ROOT / "bench" / "results"
# On 2 CPUs, 2 host instances beat 1, 3 and 4 (docs/design.md, "Decisions and their measurements").
DEFAULT_INSTANCES = 2


def parse_args(argv: list[str] | None, description: str | None = None) -> argparse.Namespace:
    """The run's options (``description``: the help text's head, bench.run's docstring)."""
    ap = argparse.ArgumentParser(prog="python -m bench", description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="a short CI-sized run (small counts, no profiling)")
    ap.add_argument("--out-dir", default=str(RESULTS))
    ap.add_argument("--instances", type=int, default=DEFAULT_INSTANCES,
                    help="host instances (one Python worker process each: the GIL makes one process's threads "
                         "wait on each other, so the app scales out by processes, as Functions does by instances)")
    ap.add_argument("--telemetry-ratio", type=float, default=DEFAULT_RATIO,
                    help=f"TelemetrySamplingRatio for the run (default {DEFAULT_RATIO}, the app's): the app exports "
                         "through the real exporter to the local receiver, which counts the bytes (bench.azure_cost)")
    ap.add_argument("--step-timeout", type=int, default=15, help="StepTimeoutSeconds for the run")
    ap.add_argument("--supervisor-period", type=int, default=5, help="seconds between supervisor sweeps")
    ap.add_argument("--emulator-messages", type=int, default=5000)
    ap.add_argument("--skip-emulator", action="store_true")
    ap.add_argument("--sweep-small", type=int, default=1000)
    ap.add_argument("--sweep-large", type=int, default=100000)
    ap.add_argument("--leftover", type=int, default=20, help="lazily-left index rows (due) before the measured sweep")
    ap.add_argument("--seed-threads", type=int, default=6)
    ap.add_argument("--search-sizes", type=lambda s: [int(x) for x in s.split(",") if x], default=[1000, 100000],
                    help="finished orders in the search index for the search page cost ('' to skip)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--window", type=int, default=48, help="orders in flight at saturation")
    ap.add_argument("--saturation-seconds", type=float, default=40.0)
    ap.add_argument("--lanes-window", type=int, default=160,
                    help="orders in flight in the priority lanes phase (10%% high, 10%% low)")
    ap.add_argument("--lanes-seconds", type=float, default=60.0, help="0 skips the priority lanes phase")
    ap.add_argument("--latency-seconds", type=float, default=40.0)
    ap.add_argument("--sustained-seconds", type=float, default=25.0)
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ap.add_argument("--skip-recovery", action="store_true")
    ap.add_argument("--recovery-hang", type=float, default=3.0, help="remote latency while the agent is killed")
    ap.add_argument("--bulk-orders", type=int, default=300,
                    help="orders in attention that ONE bulk retry acts on beside the fixed-rate load (0 skips the "
                         "bulk phase)")
    ap.add_argument("--bulk-seconds", type=float, default=40.0, help="each of the bulk phase's two loads")
    ap.add_argument("--bulk-fraction", type=float, default=0.2,
                    help="the bulk phase's load, as a fraction of the saturation rate (the latency phase's)")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, counters, profiles)")
    versus.add_args(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        args.emulator_messages = min(args.emulator_messages, 500)
        args.sweep_small, args.sweep_large = min(args.sweep_small, 50), min(args.sweep_large, 100)
        args.leftover = min(args.leftover, 5)
        args.search_sizes = [n for n in args.search_sizes if n <= 1000] or [1000]
        args.warmup = min(args.warmup, 3)
        args.window = min(args.window, 6)
        args.saturation_seconds = min(args.saturation_seconds, 5.0)
        args.lanes_window, args.lanes_seconds = min(args.lanes_window, 12), min(args.lanes_seconds, 5.0)
        args.latency_seconds = min(args.latency_seconds, 4.0)
        args.sustained_seconds = 0.0
        args.idle_seconds = min(args.idle_seconds, 6.0)
        args.supervisor_period = min(args.supervisor_period, 2)
        args.step_timeout = min(args.step_timeout, 6)
        args.recovery_hang = min(args.recovery_hang, 1.5)
        args.bulk_orders, args.bulk_seconds = min(args.bulk_orders, 40), min(args.bulk_seconds, 4.0)
        args.no_profile = True
        args.instances = min(args.instances, 2)
        versus.smoke_args(args)
    return args
