"""Start the local host on the sample app, as a subprocess on a random free loopback port."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from local.host.keys import KEY_HEADER, KEYS_FILE, HostKeys, load
from local.procs import Proc, free_port

SAMPLE_APP = Path(__file__).resolve().parent / "sample_app"
SAMPLE_QUEUES = Path(__file__).resolve().parent / "servicebus-config.json"

BASE_VALUES = {
    "FUNCTIONS_WORKER_RUNTIME": "python",
    "AzureWebJobsStorage": "UseDevelopmentStorage=true",
    # Nothing listens on port 9: Service Bus receivers retry in the background.
    "ServiceBusConnection": "Endpoint=sb://127.0.0.1:9;SharedAccessKeyName=RootManageSharedAccessKey;"
                            "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;",
    "InQueue": "sample-in",
    "OutQueue": "sample-out",
    "PoisonQueue": "sample-poison",
    "SlowQueue": "sample-slow",
    "SessionQueue": "sample-sessions",
    "SettleQueue": "sample-settle",
    "SettleAutoQueue": "sample-settle-auto",
    "TimerSchedule": "0 0 0 1 1 *",
    "Greeting": "from-local-settings",
}


@dataclass
class Host:
    proc: Proc
    port: int
    records: Path
    keys: HostKeys | None = None  # None: started with --no-keys

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def auth(self) -> dict[str, str]:
        """The header with the master key, which every route takes (none without keys)."""
        return {KEY_HEADER: self.keys.master} if self.keys else {}

    @property
    def http(self) -> requests.Session:
        """A session that sends the master key on every request."""
        s = requests.Session()
        s.headers.update(self.auth)
        return s

    def instance_pids(self) -> dict[int, int]:
        """Latest pid per instance number, from the supervisor's `instance K pid PID` lines."""
        pids: dict[int, int] = {}
        for line in list(self.proc.lines):
            m = re.fullmatch(r"instance (\d+) pid (\d+)", line)
            if m:
                pids[int(m.group(1))] = int(m.group(2))
        return pids

    def read(self, kind: str) -> list[dict[str, Any]]:
        p = self.records / f"{kind}.jsonl"
        if not p.exists():
            return []
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def start_host(tmp: Path, *, instances: int = 1, values: dict[str, str] | None = None,
               extra: list[str] | None = None, app_dir: Path = SAMPLE_APP, timeout: float = 60) -> Host:
    records = tmp / "records"
    records.mkdir(parents=True, exist_ok=True)
    settings = tmp / "local.settings.json"
    settings.write_text(json.dumps({"IsEncrypted": False,
                                    "Values": {**BASE_VALUES, "SampleRecordDir": str(records), **(values or {})}}))
    port = free_port()
    proc = Proc("host", [sys.executable, "-m", "local.host", "--app-dir", str(app_dir), "--settings", str(settings),
                         "--instances", str(instances), "--host", "127.0.0.1", "--port", str(port), *(extra or [])],
                log_path=tmp / "host.log")
    proc.start("ready http://", timeout=timeout)
    keys = None if "--no-keys" in (extra or []) else load(tmp / KEYS_FILE)  # made beside the settings file
    return Host(proc, port, records, keys)


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, interval: float = 0.1, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
