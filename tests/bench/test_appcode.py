"""bench.appcode: a py-spy raw profile's function-thread samples, split by what they were doing."""

from __future__ import annotations

import ast
from pathlib import Path

from bench.appcode import CATEGORIES, REST, split
from local.procs import REPO_ROOT

RUN = "Thread._bootstrap (threading.py:1002);_WorkItem.run (concurrent/futures/thread.py:58)"
EXECUTE = f"{RUN};execute (shared/runtime/executor.py:182)"
SEND = "send (/work/main/shared/observability/telemetry.py:297)"
PROFILE = "\n".join([
    # a table request's transport, under the pipeline: the transport only
    f"thread (0x1): invoke_0;{EXECUTE};RestTable._request (shared/storage/tables.py:173);"
    "Pipeline.run (azure/core/pipeline/_base.py:242);Urllib3Transport.send (shared/storage/transport.py:94);"
    "HTTPConnection.getresponse (http/client.py:1386) 6",
    f"thread (0x1): invoke_0;{EXECUTE};RestTable._request (shared/storage/tables.py:173);"
    "RetryPolicy.send (azure/core/pipeline/policies/_retry.py:545) 2",
    # a send: the SDK, the message built, the span around them (another file's ``send`` is not it)
    f"thread (0x2): invoke_1;{EXECUTE};{SEND};ServiceBusBus.send (shared/messaging/bus.py:55);"
    "LockedSender.send (shared/runtime/clients.py:93);encode_value (azure/servicebus/_pyamqp/_encode.py:1) 4",
    f"thread (0x2): invoke_1;{EXECUTE};{SEND};ServiceBusBus.send (shared/messaging/bus.py:44) 2",
    f"thread (0x2): invoke_1;{EXECUTE};{SEND};replace (dataclasses.py:1490) 1",
    f"thread (0x2): invoke_1;{RUN};send (http/client.py:1040) 1",
    # the storage adapter, and the app's own work
    f"thread (0x3): invoke_2;{RUN};current_view (shared/storage/views.py:40);"
    "from_entity (shared/core/rows.py:10) 3",
    f"thread (0x3): invoke_2;{RUN};decide_reply (shared/core/statemachine/forward.py:120) 1",
    # not a function thread: the host's loop; and a line that is no sample
    f"thread (0x4): loop;{RUN};LockedSender.send (shared/runtime/clients.py:93) 50",
    "process 7:\"python -m local.host\"",
])


def test_function_thread_samples_go_to_the_first_category_in_their_stack(tmp_path: Path) -> None:
    path = tmp_path / "host.txt"
    path.write_text(PROFILE + "\n", encoding="utf-8")
    out = split(path)
    assert out["function_thread_samples"] == 20
    assert out["pct_of_samples"] == {
        "table requests: transport (urllib3, http.client)": 30.0,
        "Service Bus sends: the SDK": 20.0,
        "storage adapter: rows to entities, $batch bodies and replies, views": 15.0,
        "table requests: azure-core pipeline and signing": 10.0,
        "Service Bus sends: the message built": 10.0,
        REST: 10.0,
        "Service Bus sends: the trace context they carry": 5.0,
    }


def test_a_profile_without_function_threads_is_empty(tmp_path: Path) -> None:
    empty = tmp_path / "emulator.txt"
    empty.write_text(f"thread (0x9): MainThread;{RUN} 5\n", encoding="utf-8")
    assert split(empty) == {"function_thread_samples": 0, "pct_of_samples": {}}


def test_every_category_names_a_file_or_folder_of_the_app_and_a_function_defined_there() -> None:
    """A category whose file moved would silently match nothing (as shared/storage/fence.py did)."""
    for label, function, where in CATEGORIES:
        path = REPO_ROOT / where
        assert path.is_file() if where.endswith(".py") else path.is_dir(), (label, where)
        if function is not None and path.is_file():
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = {f"{c.name}.{f.name}" for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                     for f in c.body if isinstance(f, ast.FunctionDef)}
            names |= {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}
            assert function in names, (label, function, where)
