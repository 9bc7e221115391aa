"""stack.json exists only while the stack runs, and its reader says clearly when it does not.

(No process of the stack is started here: tests/e2e/test_stack.py covers `make run` + SIGTERM.)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from local.procs import REPO_ROOT
from local.stack import Stack
from local.stackinfo import StackNotRunning, main, read_running


@pytest.fixture()
def listening() -> Iterator[str]:
    """A base URL something answers on (the host stands in as a plain listening socket)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _write(state: Path, **fields: object) -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / "stack.json").write_text(json.dumps({"stackPid": os.getpid(), "startedAt": "t0",
                                                  "logs": {"host": "/x/host.log"}, **fields}))


def test_no_file_means_not_running_and_says_how_to_start(tmp_path: Path) -> None:
    with pytest.raises(StackNotRunning, match=r"not running: .*stack.json does not exist.*make run"):
        read_running(tmp_path)


def test_a_file_left_by_a_killed_stack_is_not_believed(tmp_path: Path, listening: str) -> None:
    _write(tmp_path, stackPid=_dead_pid(), baseUrl=listening)
    with pytest.raises(StackNotRunning, match=r"not running: the process that wrote .* is gone"):
        read_running(tmp_path)


def test_a_host_that_does_not_answer_is_named_with_its_log(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _write(tmp_path, baseUrl=f"http://127.0.0.1:{port}")
    with pytest.raises(StackNotRunning, match=r"does not answer at http://127\.0\.0\.1:\d+; see /x/host\.log"):
        read_running(tmp_path)


@pytest.mark.parametrize("content", ["{not json", "[]", ""])
def test_an_unreadable_file_means_not_running(tmp_path: Path, content: str) -> None:
    (tmp_path / "stack.json").write_text(content)
    with pytest.raises(StackNotRunning, match="not running"):
        read_running(tmp_path)


def test_a_running_stack_is_read(tmp_path: Path, listening: str) -> None:
    _write(tmp_path, baseUrl=listening)
    assert read_running(tmp_path)["baseUrl"] == listening


def test_cli_prints_the_url_or_only_an_error(tmp_path: Path, listening: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--state-dir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: the local stack is not running")  # BASE=$(...) stays empty
    _write(tmp_path, baseUrl=listening, apiUrl=listening + "/api")
    assert main(["--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == listening + "\n"
    assert main(["--state-dir", str(tmp_path), "--key", "apiUrl"]) == 0
    assert capsys.readouterr().out == listening + "/api\n"
    assert main(["--state-dir", str(tmp_path), "--key", "nope"]) == 2
    assert "no field 'nope'" in capsys.readouterr().err


def test_cli_prints_the_remotes_base_url(tmp_path: Path, listening: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`REMOTES=$(... --remotes)` in README.md: the URL alone, or nothing and why (exit 1)."""
    assert main(["--state-dir", str(tmp_path), "--remotes"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: the local stack is not running")
    remotes = {"baseUrl": "http://127.0.0.1:48643", "ledger": "http://127.0.0.1:48643/_ledger", "pid": 7}
    _write(tmp_path, baseUrl=listening, remotes=remotes)
    assert main(["--state-dir", str(tmp_path), "--remotes"]) == 0
    assert capsys.readouterr().out == "http://127.0.0.1:48643\n"
    assert main(["--state-dir", str(tmp_path), "--key", "remotes.ledger"]) == 0
    assert capsys.readouterr().out == "http://127.0.0.1:48643/_ledger\n"
    assert main(["--state-dir", str(tmp_path), "--key", "remotes"]) == 0  # the whole object, as before
    assert json.loads(capsys.readouterr().out) == remotes


@pytest.mark.parametrize(("key", "error"), [
    ("remotes.nope", "field 'remotes' has no field 'nope'; it has: baseUrl"),
    ("baseUrl.port", "field 'baseUrl' has no field 'port'; it is not an object"),
    ("nope.baseUrl", "stack.json has no field 'nope'; it has: "),
])
def test_cli_names_a_missing_field(tmp_path: Path, listening: str, capsys: pytest.CaptureFixture[str],
                                   key: str, error: str) -> None:
    _write(tmp_path, baseUrl=listening, remotes={"baseUrl": "http://127.0.0.1:48643"})
    assert main(["--state-dir", str(tmp_path), "--key", key]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: " + error), err


def test_cli_takes_a_key_or_remotes_not_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--state-dir", str(tmp_path), "--remotes", "--key", "apiUrl"])
    assert exited.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("args", [[], ["--remotes"], ["--key", "remotes.baseUrl"]])
def test_cli_runs_on_the_standard_library_alone(tmp_path: Path, args: list[str]) -> None:
    """`python3 -m local.stackinfo` from the repository, outside the venv (-S: no site-packages)."""
    r = subprocess.run([sys.executable, "-S", "-m", "local.stackinfo", *args, "--state-dir", str(tmp_path)],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and r.stdout == "" and "not running" in r.stderr, r
    assert "Traceback" not in r.stderr, r.stderr


def test_stop_removes_the_stack_json_it_wrote(tmp_path: Path) -> None:
    stack = Stack(tmp_path, persistent=False)
    stack.started_at = "2026-01-01T00:00:00+00:00"
    stack.write_stack_json()
    assert json.loads(stack.stack_json_path.read_text())["stackPid"] == os.getpid()
    stack.stop()
    assert not stack.stack_json_path.exists()
    stack.stop()  # twice is fine


def test_stop_leaves_another_stacks_file_alone(tmp_path: Path) -> None:
    _write(tmp_path, startedAt="another start", baseUrl="http://127.0.0.1:1")
    stack = Stack(tmp_path, persistent=False)
    stack.started_at = "2026-01-01T00:00:00+00:00"
    stack.stop()
    assert stack.stack_json_path.exists()


def test_start_removes_a_stale_file_first_and_a_failed_start_writes_none(tmp_path: Path) -> None:
    _write(tmp_path, stackPid=_dead_pid(), baseUrl="http://127.0.0.1:1")
    stack = Stack(tmp_path, persistent=False)

    def fail() -> None:
        assert not stack.stack_json_path.exists()  # gone before anything starts
        raise RuntimeError("azurite did not start")

    stack._start_azurite = fail  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="azurite did not start"):
        stack.start()
    assert not stack.stack_json_path.exists()
