"""The Service Bus emulator's Config.json with the priority lanes' queues.

``infra/servicebus-config.json`` declares the queues (the official emulator's format) and
``workflows/lanes.json`` the lanes; each lane's copy of a work queue (``scheduler-high``...) is
derived here with :func:`shared.core.workflows.lanes.with_lane_queues`, as Bicep derives it in ``infra/main.bicep``.
The local stack hands the emulator the derived file (``.local/servicebus-config.json``).

``python -m local.queueconfig [SOURCE] > Config.json`` prints it, to mount into the official
emulator (``/ServiceBus_Emulator/ConfigFiles/Config.json``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from local.procs import REPO_ROOT
from shared.core.workflows.lanes import with_lane_queues

QUEUE_CONFIG = REPO_ROOT / "infra" / "servicebus-config.json"


def derived_config(source: Path = QUEUE_CONFIG) -> str:
    """``source`` with the lanes' queues, as JSON text."""
    return json.dumps(with_lane_queues(json.loads(source.read_text(encoding="utf-8"))), indent=2) + "\n"


def write_derived(source: Path, dest: Path) -> Path:
    """Write ``source`` with the lanes' queues to ``dest``; a ``source`` that is not a Config.json
    is copied as it is, for the emulator to refuse it with its own message."""
    try:
        text = derived_config(source)
    except (ValueError, KeyError, TypeError):
        text = source.read_text(encoding="utf-8", errors="replace")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text, encoding="utf-8")
    return dest


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    sys.stdout.write(derived_config(Path(args[0]) if args else QUEUE_CONFIG))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
