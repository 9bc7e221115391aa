"""The host on the sample app: HTTP triggers, settings, instances, failures (no Service Bus needed)."""

from __future__ import annotations

import http.client
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Host, start_host, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    h = start_host(tmp_path_factory.mktemp("host-http"), instances=2, extra=["--set", "Greeting=from-set"])
    yield h
    h.proc.stop()


def test_startup_lines(host: Host):
    lines = list(host.proc.lines)
    assert "instance 1 pid" in "\n".join(lines) and "instance 2 pid" in "\n".join(lines)
    ready = [i for i, line in enumerate(lines) if line.startswith("ready http://")]
    assert lines[ready[0]] == f"ready http://127.0.0.1:{host.port}"
    pid_lines = [i for i, line in enumerate(lines) if line.startswith("instance ")]
    assert max(pid_lines[:2]) < ready[0]
    assert any(line.startswith("[instance 1] ") and "Found function get_item" in line for line in lines)


def test_get_with_route_param_query_and_settings(host: Host):
    r = host.http.get(f"{host.url}/sample/items/42", params={"x": "1", "y": "two"}, timeout=10)
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "application/json"
    assert r.headers["X-Sample"] == "yes"
    body = r.json()
    assert body["id"] == 42 and body["params"] == {"x": "1", "y": "two"}
    assert body["url"] == f"{host.url}/sample/items/42?x=1&y=two"
    assert body["greeting"] == "from-set"  # --set wins over local.settings.json
    assert body["instance"].startswith("local-")


def test_route_constraint_prefix_and_methods(host: Host):
    assert host.http.get(f"{host.url}/sample/items/abc", timeout=10).status_code == 404  # {id:int}
    assert host.http.get(f"{host.url}/api/items/42", timeout=10).status_code == 404  # routePrefix is "sample"
    r = host.http.delete(f"{host.url}/sample/items/42", timeout=10)
    assert r.status_code == 405 and r.headers["Allow"] == "GET"
    assert host.http.get(f"{host.url}/sample/nothing-here", timeout=10).status_code == 404


def test_post_echo(host: Host):
    payload = os.urandom(200_000)
    r = host.http.post(f"{host.url}/sample/echo", data=payload, headers={"Content-Type": "application/x-test"},
                      timeout=10)
    assert r.status_code == 201 and r.content == payload
    assert r.headers["Content-Type"] == "application/x-test" and r.headers["X-Method"] == "POST"


def test_chunked_body(host: Host):
    r = host.http.put(f"{host.url}/sample/echo", data=iter([b"ab", b"cd", b"ef"]), timeout=10)
    assert r.status_code == 201 and r.content == b"abcdef" and r.headers["X-Method"] == "PUT"


def test_async_function_and_optional_param(host: Host):
    assert host.http.get(f"{host.url}/sample/hello", timeout=10).text == "hello nobody"
    assert host.http.post(f"{host.url}/sample/hello/ann%20b", timeout=10).text == "hello ann b"


def test_context_and_guid_constraint(host: Host):
    oid = str(uuid.uuid4())
    r = host.http.get(f"{host.url}/sample/orders/{oid}/lines/3", timeout=10)
    assert r.status_code == 200 and r.text == f"{oid}|3|order_line"
    assert r.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert host.http.get(f"{host.url}/sample/orders/123/lines/3", timeout=10).status_code == 404


def test_exception_is_500_and_logged(host: Host):
    r = host.http.get(f"{host.url}/sample/boom", timeout=10)
    assert r.status_code == 500
    wait_for(lambda: any("boom on purpose" in line for line in host.proc.lines), 5, what="the error in the log")
    assert any("Executed 'Functions.boom' (Failed" in line for line in host.proc.lines)


def test_function_logging_reaches_stdout(host: Host):
    host.http.post(f"{host.url}/sample/echo", data=b"12345", timeout=10)
    wait_for(lambda: any("echo got 5 bytes" in line for line in host.proc.lines), 5, what="the function's log line")


def test_both_instances_serve_the_port(host: Host):
    seen = set()
    for _ in range(60):
        c = http.client.HTTPConnection("127.0.0.1", host.port, timeout=5)  # a new connection each time
        c.request("GET", "/admin/host/status", headers=host.auth)
        seen.add(c.getresponse().read())
        c.close()
    ids = {s for s in seen}
    assert len(ids) >= 2


def test_killed_instance_is_restarted(host: Host):
    before = host.instance_pids()
    victim = before[2]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: host.instance_pids().get(2) not in (None, victim), 10, what="instance 2 restarted")
    new_pid = host.instance_pids()[2]
    assert any(f"instance 2 (pid {victim}" in line and "exited" in line for line in host.proc.lines)
    wait_for(lambda: sum("host: instance 2 (" in line and "listening" in line for line in host.proc.lines) >= 2, 20,
             what="instance 2 listening again")
    assert new_pid != victim and host.instance_pids()[1] == before[1]
    # and it serves with a new instance id
    ids = set()
    for _ in range(60):
        r = host.http.get(f"{host.url}/sample/items/1", timeout=5, headers={"Connection": "close"})
        ids.add(r.json()["instance"])
    assert any(i.startswith("local-2-") for i in ids)


def test_sigterm_stops_every_instance(tmp_path: Path):
    h = start_host(tmp_path, instances=2)
    pids = list(h.instance_pids().values())
    assert len(pids) == 2
    h.proc.popen.send_signal(signal.SIGTERM)  # the supervisor only, not its group
    assert h.proc.popen.wait(timeout=30) == 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert any("host: stopped" in line for line in h.proc.lines)
    h.proc.stop()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie nobody reaped yet
    except FileNotFoundError:
        return True


def test_instances_do_not_outlive_a_killed_supervisor(tmp_path: Path):
    h = start_host(tmp_path, instances=2)
    pids = list(h.instance_pids().values())
    try:
        os.kill(h.proc.pid, signal.SIGKILL)  # the supervisor alone: no chance to stop its instances
        wait_for(lambda: all(_gone(p) for p in pids), 15, what="the orphaned instances to exit")
    finally:
        h.proc.stop()


def test_broken_app_fails_startup(tmp_path: Path):
    app = tmp_path / "app"
    app.mkdir()
    (app / "function_app.py").write_text(
        "import azure.functions as func\napp = func.FunctionApp()\nraise SystemError('bad app')\n")
    with pytest.raises(RuntimeError) as e:
        start_host(tmp_path, app_dir=app, timeout=30)
    assert "bad app" in str(e.value) and "failed to start" in str(e.value)


def test_the_body_limit_setting_is_honoured(tmp_path: Path) -> None:
    """``FUNCTIONS_REQUEST_BODY_SIZE_LIMIT`` (bytes) caps a request's body, as the host's
    HttpRequestBodySizeMiddleware does; beyond it, 413 and the function never runs."""
    h = start_host(tmp_path, values={"FUNCTIONS_REQUEST_BODY_SIZE_LIMIT": "1000"})
    try:
        small = h.http.post(f"{h.url}/sample/echo", data=b"x" * 1000, timeout=10)
        big = h.http.post(f"{h.url}/sample/echo", data=b"x" * 1001, timeout=10)
        assert (small.status_code, big.status_code) == (201, 413)
    finally:
        h.proc.stop()
