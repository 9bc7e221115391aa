"""local.procs: readiness, failure to start, and facts that outlive the bounded output buffer."""

from __future__ import annotations

import sys

import pytest

from local.procs import Proc


def test_on_line_sees_every_line_even_those_the_buffer_dropped() -> None:
    seen: list[str] = []
    script = "print('instance 0 pid 4242'); [print('noise', i) for i in range(5000)]; print('ready', flush=True)"
    p = Proc("talker", [sys.executable, "-c", script], on_line=seen.append)
    p.start("ready", timeout=30)
    p.popen.wait(timeout=30)  # type: ignore[union-attr]
    p.stop()
    assert "instance 0 pid 4242" not in p.lines  # the bounded buffer lost it...
    assert seen[0] == "instance 0 pid 4242" and seen[-1] == "ready"  # ...the hook did not
    assert len(seen) == 5002


def test_a_process_that_exits_before_ready_fails_fast_with_its_output() -> None:
    p = Proc("dies", [sys.executable, "-c", "print('bad config'); raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match="exit code 3") as err:
        p.start("ready", timeout=30)
    assert "bad config" in str(err.value)
