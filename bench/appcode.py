"""Where the function code's CPU goes: a host instance's py-spy ``--gil`` profile, its function
threads' samples split by what they were doing (``python -m bench.appcode PROFILE.txt ...``).

The bench profiles one host instance over the middle of saturation with ``--gil`` (only the
thread holding the GIL is sampled: Python's CPU, not its waits) and keeps the raw file under the
work folder's ``profiles/`` (``--keep``). Only the local host's function threads count (named
``invoke_N``: the ``app_code`` of ``bench.cpu_split``). A sample goes to the first category, in
the order below, that has a frame anywhere in its stack, so a table request's transport is not
also counted as the pipeline around it; what matches none is the app's own work (the decisions,
the rows, JSON, the messages' models) and what the trigger adapters do around it.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

THREAD_PREFIX = "invoke"
# (category, its function or None: any, its file (the path ends with it) or folder (a path holds it))
CATEGORIES: list[tuple[str, str | None, str]] = [
    ("table requests: transport (urllib3, http.client)", "Urllib3Transport.send", "shared/storage/transport.py"),
    ("table requests: azure-core pipeline and signing", "RestTable._request", "shared/storage/tables.py"),
    ("Service Bus sends: the SDK", "LockedSender.send", "shared/runtime/clients.py"),
    ("Service Bus sends: the message built", "ServiceBusBus.send", "shared/messaging/bus.py"),
    ("Service Bus sends: the trace context they carry", "send", "shared/observability/telemetry.py"),
    ("agents' remote calls", None, "shared/agent/remote.py"),
    ("log lines", "log_event", "shared/observability/logs.py"),
    ("CONSUMER spans", "consumer_span", "shared/observability/telemetry.py"),
    ("fencing tokens (encode, check)", None, "shared/storage/fence.py"),
    ("storage adapter: rows to entities, $batch bodies and replies, views", None, "shared/storage/"),
]
REST = "the app's own work: decisions, rows, JSON, message models, trigger adapters"


def _thread(first: str) -> str:
    """The thread's name of a raw stack's first element (``thread (0x7f..): invoke_3``)."""
    return first.split(": ", 1)[1] if ": " in first else ""


def _frame(frame: str) -> tuple[str, str]:
    """(function, file) of a raw frame: ``send (shared/observability/telemetry.py:297)``."""
    name, _, where = frame.partition(" (")
    return name, where.rstrip(")").rpartition(":")[0]


def category(frames: list[str]) -> str:
    """The first category with a frame in ``frames`` (a stack, outermost first), else ``REST``."""
    parsed = [_frame(f) for f in frames]
    for label, function, where in CATEGORIES:
        for name, path in parsed:
            if (function is None or name == function) and (
                    path.endswith(where) if where.endswith(".py") else where in path):
                return label
    return REST


def split(path: Path) -> dict[str, Any]:
    """The function threads' samples of a raw (collapsed stacks) profile, per category, in percent."""
    counts: Counter[str] = Counter()
    total = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if not n.isdigit() or not _thread(frames[0]).startswith(THREAD_PREFIX):
            continue
        total += int(n)
        counts[category(frames[1:])] += int(n)
    shares = {name: round(100.0 * c / total, 1) for name, c in counts.most_common()} if total else {}
    return {"function_thread_samples": total, "pct_of_samples": shares}


def plot(result: dict[str, Any], out: Path, title: str) -> None:
    """One profile's split as horizontal bars, largest on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = sorted(result["pct_of_samples"].items(), key=lambda kv: kv[1])
    fig, ax = plt.subplots(figsize=(12, 0.42 * len(items) + 1.4))
    bars = ax.barh([k for k, _ in items], [v for _, v in items], color="tab:blue")
    ax.bar_label(bars, fmt="%.1f%%", padding=3)
    ax.set_xlabel(f"% of the function threads' GIL samples ({result['function_thread_samples']} samples)")
    fig.suptitle(title)
    ax.set_xlim(0, max((v for _, v in items), default=1) * 1.15)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="+", type=Path, help="py-spy raw files (record --format raw --threads --gil)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--plot", type=Path, help="draw the first profile's split into this PNG")
    ap.add_argument("--title", default="Where the function code's CPU goes (py-spy --gil, one host instance)")
    args = ap.parse_args(argv)
    out = {str(p): split(p) for p in args.profiles}
    if args.plot:
        plot(out[str(args.profiles[0])], args.plot, args.title)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for path, result in out.items():
        print(f"{path}: {result['function_thread_samples']} samples of the function threads")
        for name, pct in result["pct_of_samples"].items():
            print(f"  {pct:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
