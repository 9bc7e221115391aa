"""Where the function code's CPU goes: a host instance's py-spy ``--gil`` profile (Python's CPU, not
its waits), its function threads' (``invoke_N``) samples split by what they were doing. A sample
goes to the first category below with a frame in its stack; what matches none is the app's own
work (decisions, rows, JSON, message models) and the trigger adapters around it.
"""

from __future__ import annotations

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
    ("fencing tokens (encode, check)", None, "shared/core/fence.py"),
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
