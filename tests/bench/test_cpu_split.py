"""The CPU split of the host instances: the app's threads, the host's loop, the rest (bench.cpu_split)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from bench import cpu_split
from bench.cpu_split import Sample, SplitMeter, parse_stat, split
from local.host.threadroles import ThreadRoles

HZ = os.sysconf("SC_CLK_TCK")


def stat_line(pid: int, comm: str, utime: int, stime: int) -> str:
    # fields after the command: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    return f"{pid} ({comm}) S 1 1 1 0 -1 4194560 10 0 0 0 {utime} {stime} 0 0 20 0 3 0 100 1000 10\n"


def test_parse_stat_takes_utime_plus_stime_even_with_spaces_and_parens_in_the_command():
    assert parse_stat(stat_line(7, "we ird) (name", 120, 30)) == 150.0


def test_parse_stat_of_this_thread_is_a_number():
    text = Path(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/stat").read_text()
    assert parse_stat(text) >= 0


def test_split_groups_threads_by_role_and_puts_the_rest_in_host_other():
    roles = {10: "loop", 11: "invoke", 12: "invoke", 13: "http", 14: "invoke"}
    before = Sample(total=1000, threads={10: 100, 11: 200, 12: 300, 13: 5, 14: 50})
    roles[15] = "invoke"  # 15 was born in the window (counts from 0), 14 ended in it
    after = Sample(total=1600, threads={10: 250, 11: 260, 12: 400, 13: 7, 15: 40})
    out = split(before, after, roles)
    assert out["host_loop"] == 150
    assert out["app"] == 60 + 100 + 40  # 11, 12, and 15 from 0
    # the process grew by 600: 150 + 200 + 2 (http) in live threads, 248 in threads gone or never registered
    assert out["host_other"] == 2 + (600 - 352)
    assert sum(out.values()) == 600


def _fake_proc(root: Path, pid: int, total: int, threads: dict[int, int]) -> None:
    (root / str(pid) / "task").mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "stat").write_text(stat_line(pid, "python", total, 0))
    for tid, t in threads.items():
        (root / str(pid) / "task" / str(tid)).mkdir(exist_ok=True)
        (root / str(pid) / "task" / str(tid) / "stat").write_text(stat_line(tid, "python", t, 0))


def test_meter_sums_instances_from_their_roles_files_in_seconds(tmp_path: Path):
    proc, roles_dir = tmp_path / "proc", tmp_path / "roles"
    roles_dir.mkdir()
    for pid, tids in ((101, (1, 2)), (202, (3, 4))):
        (roles_dir / f"{pid}.json").write_text(json.dumps({"pid": pid, "threads": {str(tids[0]): "loop",
                                                                                  str(tids[1]): "invoke"}}))
    _fake_proc(proc, 101, 10, {1: 4, 2: 5})
    _fake_proc(proc, 202, 10, {3: 4, 4: 5})
    meter = SplitMeter(roles_dir, [101, 202, 303], proc=str(proc))  # 303: gone, ignored
    meter.start()
    _fake_proc(proc, 101, 10 + 3 * HZ, {1: 4 + HZ, 2: 5 + 2 * HZ})
    _fake_proc(proc, 202, 10 + 4 * HZ, {3: 4, 4: 5 + 3 * HZ})
    out = meter.stop()
    assert out == {"instances": 2, "cpu_seconds": {"app": 5.0, "host_loop": 1.0, "host_other": 1.0}}


def test_meter_on_this_process_attributes_a_busy_thread_to_its_role(tmp_path: Path):
    roles = ThreadRoles(str(tmp_path))
    go, done, release = threading.Event(), threading.Event(), threading.Event()

    def busy() -> None:
        roles.register("invoke")
        go.wait()
        start = time.thread_time()
        while time.thread_time() - start < 0.1:  # 0.1 s of this thread's own CPU, however loaded the machine
            pass
        done.set()
        release.wait()  # alive until measured: an ended thread's CPU is in the process total only

    t = threading.Thread(target=busy)
    t.start()
    roles.register("loop")  # this thread: idle while the other spins
    meter = SplitMeter(tmp_path, [os.getpid()])
    meter.start()
    go.set()
    done.wait()
    out = meter.stop()
    release.set()
    t.join()
    cs = out["cpu_seconds"]
    assert out["instances"] == 1
    assert cs["app"] >= 0.09 > cs["host_loop"]


def test_per_order_in_ms_with_other_processes_by_name():
    po = cpu_split.per_order({"cpu_seconds": {"app": 2.0, "host_loop": 1.0, "host_other": 0.1}},
                             {"host instance 1": 3.1, "azurite": 0.5, "remotes": 0.1}, orders=100)
    assert po == {"app_code": 20.0, "host_loop": 10.0, "host_other_threads": 1.0,
                  "other_processes": {"azurite": 5.0, "remotes": 1.0}, "other_processes_total": 6.0, "orders": 100}
    assert cpu_split.per_order({}, {}, 0) == {}
    line = cpu_split.report_line({"cpu_ms_per_order_split": po})
    assert line is not None and line.startswith("CPU ms per order, split: app code 20.0")
    assert "host receive/settle loop 10.0" in line
    assert "control" not in line  # no bench process measured: no ratio


def test_app_code_is_also_given_over_the_bench_process_cpu() -> None:
    """The machine-speed control (cpu_split.CONTROL): the same work per order in every run."""
    po = cpu_split.per_order({"cpu_seconds": {"app": 2.0, "host_loop": 1.0, "host_other": 0.1}},
                             {cpu_split.CONTROL: 0.25, "azurite": 0.5}, orders=100)
    assert po["app_code_over_control"] == 8.0
    line = cpu_split.report_line({"cpu_ms_per_order_split": po})
    assert line is not None and line.endswith("(machine-speed control) 8.0")


def test_host_env_names_the_hosts_variable(tmp_path: Path):
    from local.host.threadroles import ENV

    assert cpu_split.host_env(tmp_path) == {ENV: str(tmp_path)}


@pytest.mark.parametrize("body", ["", "{", '{"threads": null}'])
def test_a_missing_or_torn_roles_file_reads_as_no_roles(tmp_path: Path, body: str):
    if body:
        (tmp_path / "5.json").write_text(body)
    assert cpu_split.read_roles(tmp_path, 5) == {}
