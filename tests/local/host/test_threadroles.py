"""The instances name their threads' roles for a CPU split measured from outside (local.host.threadroles)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from local.host.threadroles import ENV, ThreadRoles

from .conftest import Host, start_host, wait_for


def test_without_a_directory_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(ENV, raising=False)
    roles = ThreadRoles.from_env()
    roles.register("loop")
    assert roles.path is None and list(tmp_path.iterdir()) == []


def test_each_thread_registers_itself_and_the_file_is_whole(tmp_path: Path):
    roles = ThreadRoles(str(tmp_path / "roles"))
    tids: dict[str, int] = {}

    def worker(role: str) -> None:
        tids[role] = threading.get_native_id()
        roles.register(role)

    threads = [threading.Thread(target=worker, args=(r,)) for r in ("loop", "invoke", "http")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    roles.register("main")
    data = json.loads((tmp_path / "roles" / f"{os.getpid()}.json").read_text())
    assert data["pid"] == os.getpid()
    assert data["threads"] == {str(tids["loop"]): "loop", str(tids["invoke"]): "invoke",
                               str(tids["http"]): "http", str(threading.get_native_id()): "main"}
    assert sorted(p.name for p in (tmp_path / "roles").iterdir()) == [f"{os.getpid()}.json"]  # no temp left


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Host, Path]]:
    tmp = tmp_path_factory.mktemp("host-roles")
    h = start_host(tmp, instances=1, values={ENV: str(tmp / "roles")})
    yield h, tmp / "roles"
    h.proc.stop()


def _roles(directory: Path, pid: int) -> dict[int, str]:
    try:
        return {int(t): r for t, r in json.loads((directory / f"{pid}.json").read_text())["threads"].items()}
    except (OSError, ValueError):
        return {}


@pytest.mark.integration
def test_sync_functions_run_on_invoke_threads_async_ones_on_the_loop(host: tuple[Host, Path]):
    h, directory = host
    sync = h.http.get(f"{h.url}/sample/thread/sync", timeout=10).json()
    asy = h.http.get(f"{h.url}/sample/thread/async", timeout=10).json()
    assert sync["pid"] == asy["pid"] == h.instance_pids()[1]
    roles = wait_for(lambda: (r := _roles(directory, sync["pid"])) and sync["tid"] in r and r,
                     what="the roles file naming the invoke thread")
    assert roles[sync["tid"]] == "invoke"
    assert roles[asy["tid"]] == "loop"
    assert sorted(set(roles.values())) == ["http", "invoke", "loop", "main"]
    for tid in roles:  # every one a thread of that instance
        assert Path(f"/proc/{sync['pid']}/task/{tid}").exists()
