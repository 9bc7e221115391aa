"""The local host checks function keys as the Azure host does (local.host.keys): each route by its
``authLevel``, the key from ``x-functions-key`` or ``?code=``, 401 with an empty body without it."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from local.host.keys import KEYS_FILE, HostKeys, KeysError, level_of, load, load_or_create, presented_key

from .conftest import Host, start_host, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    h = start_host(tmp_path_factory.mktemp("keyed-host"))
    yield h
    h.proc.stop()


def status(host: Host, path: str, key: str | None = None, how: str = "header") -> int:
    headers = {"x-functions-key": key} if key is not None and how == "header" else {}
    params = {"code": key} if key is not None and how == "query" else {}
    return requests.get(f"{host.url}{path}", headers=headers, params=params, timeout=10).status_code


def test_each_level_takes_the_keys_azure_takes(host: Host) -> None:
    assert host.keys is not None
    master, function = host.keys.master, host.keys.function
    cases = {  # path: (no key, a wrong key, the function key, the master key)
        "/sample/open": (200, 200, 200, 200),  # anonymous
        "/sample/items/1": (401, 401, 200, 200),  # function
        "/sample/secret": (401, 401, 401, 200),  # admin: the master key only
        "/admin/host/status": (401, 401, 401, 200),  # the host's own admin route
    }
    for how in ("header", "query"):
        got = {path: (status(host, path, None, how), status(host, path, "not-a-key", how),
                      status(host, path, function, how), status(host, path, master, how)) for path in cases}
        assert got == cases, how


def test_a_refusal_is_an_empty_401_and_the_function_never_runs(host: Host) -> None:
    def runs() -> int:
        return sum("Executing 'Functions.echo'" in line for line in list(host.proc.lines))

    before = runs()
    r = requests.post(f"{host.url}/sample/echo", data=b"should not be echoed", timeout=10)
    assert (r.status_code, r.content) == (401, b"")
    r = requests.post(f"{host.url}/sample/echo", data=b"12345", headers=host.auth, timeout=10)
    assert r.status_code == 201 and r.content == b"12345"
    wait_for(lambda: runs() == before + 1, what="the keyed call's Executing line")
    time.sleep(0.3)
    assert runs() == before + 1  # the keyed call only


def test_the_header_wins_over_the_query(host: Host) -> None:
    """As the host reads it: ``x-functions-key`` first, ``code`` only without the header."""
    assert host.keys is not None
    r = requests.get(f"{host.url}/sample/secret", headers={"x-functions-key": host.keys.function},
                     params={"code": host.keys.master}, timeout=10)
    assert r.status_code == 401


def test_no_route_is_404_and_a_wrong_method_405_before_any_key(host: Host) -> None:
    assert requests.get(f"{host.url}/sample/nothing-here", timeout=10).status_code == 404
    assert requests.delete(f"{host.url}/sample/items/1", timeout=10).status_code == 405


def test_without_keys_every_route_is_open(tmp_path: Path) -> None:
    h = start_host(tmp_path, extra=["--no-keys"])
    try:
        assert [status(h, p) for p in ("/sample/open", "/sample/items/1", "/sample/secret", "/admin/host/status")] \
            == [200, 200, 200, 200]
        assert any("--no-keys" in line for line in h.proc.lines)
        assert not (tmp_path / KEYS_FILE).exists()
    finally:
        h.proc.stop()


# ------------------------------------------------------------------------- the keys file (no host)

def test_the_keys_are_made_once_readable_by_their_owner_only(tmp_path: Path) -> None:
    path = tmp_path / KEYS_FILE
    first = load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_or_create(path) == first and load(path) == first
    assert first.master != first.function and len(first.master) >= 40
    doc = json.loads(path.read_text())
    assert doc["masterKey"]["value"] == first.master and doc["functionKeys"][0] == {"name": "default",
                                                                                    "value": first.function}


@pytest.mark.parametrize("text", ["", "{}", '{"masterKey": {"value": "m"}, "functionKeys": []}',
                                  '{"masterKey": {"value": ""}, "functionKeys": [{"name": "d", "value": "f"}]}'])
def test_a_file_without_keys_is_refused_by_name(tmp_path: Path, text: str) -> None:
    path = tmp_path / "keys.json"
    path.write_text(text)
    with pytest.raises(KeysError, match="keys.json"):
        load(path)


def test_levels_and_where_the_key_is_read() -> None:
    keys = HostKeys("m" * 40, {"default": "f" * 40, "other": "o" * 40})
    assert [keys.allows(lvl, k) for lvl in ("anonymous", "function", "admin") for k in (None, "o" * 40, "m" * 40)] \
        == [True, True, True, False, True, True, False, False, True]
    assert [level_of(v) for v in ("FUNCTION", "Admin", "anonymous", None)] == ["function", "admin", "anonymous",
                                                                                "function"]
    with pytest.raises(KeysError):
        level_of("user")
    assert presented_key({"X-Functions-Key": "h"}, {"code": "q"}) == "h"
    assert presented_key({}, {"code": "q"}) == "q" and presented_key({}, {}) is None

