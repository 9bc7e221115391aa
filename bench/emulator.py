"""Benchmark of the local Service Bus emulator through the unmodified azure-servicebus SDK.

    python -m bench.emulator [--messages 20000] [--size 200] [--receivers 2] [--prefetch 200]
                             [--dedup] [--out bench/results/emulator.json]

It starts the emulator on a free port with a throwaway queue and data folder, then measures
**send** (one sender's ``ServiceBusMessageBatch`` objects, msgs/s until the last is accepted:
committed to SQLite) and **receive+complete** (``--receivers`` processes, peek-lock, one
``complete_message`` each), each with the emulator's CPU seconds against the clients'.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

from bench.profiling import cpu_seconds
from local.connections import servicebus_connection_string
from local.procs import REPO_ROOT, Proc, free_port

QUEUE = "bench"


def _config(dedup: bool) -> dict:
    return {
        "UserConfig": {
            "Namespaces": [{
                "Name": "sbemulatorns",
                "Queues": [{
                    "Name": QUEUE,
                    "Properties": {
                        "DeadLetteringOnMessageExpiration": False,
                        "DefaultMessageTimeToLive": "PT1H",
                        "DuplicateDetectionHistoryTimeWindow": "PT5M",
                        "LockDuration": "PT1M",
                        "MaxDeliveryCount": 10,
                        "RequiresDuplicateDetection": dedup,
                        "RequiresSession": False,
                    },
                }],
                "Topics": [],
            }],
            "Logging": {"Type": "File"},
        }
    }


def cpu(pid: int) -> float:
    return cpu_seconds(pid) or 0.0


def self_cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _receiver(conn_str: str, total: int, prefetch: int, counter, done, start_evt, out_q) -> None:  # noqa: ANN001
    from azure.servicebus import ServiceBusClient

    cpu0 = self_cpu_seconds()
    n = 0
    with ServiceBusClient.from_connection_string(conn_str) as client:
        with client.get_queue_receiver(QUEUE, prefetch_count=prefetch) as receiver:
            start_evt.wait()
            while not done.is_set():
                msgs = receiver.receive_messages(max_message_count=prefetch, max_wait_time=1)
                for m in msgs:
                    receiver.complete_message(m)
                n += len(msgs)
                if msgs:
                    with counter.get_lock():
                        counter.value += len(msgs)
                        if counter.value >= total:
                            done.set()
    out_q.put({"received": n, "cpu_s": self_cpu_seconds() - cpu0})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.emulator", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--size", type=int, default=200, help="body bytes per message")
    ap.add_argument("--receivers", type=int, default=2)
    ap.add_argument("--prefetch", type=int, default=200)
    ap.add_argument("--dedup", action="store_true", help="queue with duplicate detection (each message has an id)")
    ap.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "emulator.json"))
    args = ap.parse_args(argv)

    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    work = Path(tempfile.mkdtemp(prefix="bench-sb-"))
    cfg = work / "Config.json"
    cfg.write_text(json.dumps(_config(args.dedup)), encoding="utf-8")
    port = free_port()
    cmd = [sys.executable, "-m", "local.servicebus", "--config", str(cfg), "--host", "127.0.0.1",
           "--port", str(port), "--data-dir", str(work / "data")]
    proc = Proc("servicebus", cmd).start("ready", timeout=60)
    conn_str = servicebus_connection_string("127.0.0.1", port)
    result: dict = {
        "messages": args.messages, "body_bytes": args.size, "receivers": args.receivers,
        "prefetch": args.prefetch, "duplicate_detection": args.dedup,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "loadavg_before": os.getloadavg()[0]},
    }
    try:
        body = b"x" * args.size
        # ---------------------------------------------------------------- send
        with ServiceBusClient.from_connection_string(conn_str) as client:
            with client.get_queue_sender(QUEUE) as sender:
                sender.send_messages(ServiceBusMessage(b"warm-up"))  # opens the link before timing
                with client.get_queue_receiver(QUEUE) as r:  # and take the warm-up message away again
                    for m in r.receive_messages(max_message_count=1, max_wait_time=5):
                        r.complete_message(m)
                emu0, me0, t0 = cpu(proc.pid), self_cpu_seconds(), time.perf_counter()
                sent = 0
                batches = 0
                while sent < args.messages:
                    batch = sender.create_message_batch()
                    while sent < args.messages:
                        msg = ServiceBusMessage(body, message_id=f"m-{sent}" if args.dedup else None)
                        try:
                            batch.add_message(msg)
                        except ValueError:
                            break
                        sent += 1
                    sender.send_messages(batch)
                    batches += 1
                t1 = time.perf_counter()
                emu1, me1 = cpu(proc.pid), self_cpu_seconds()
        send_s = t1 - t0
        result["send"] = {
            "seconds": round(send_s, 3), "msgs_per_s": round(args.messages / send_s, 1), "batches": batches,
            "emulator_cpu_s": round(emu1 - emu0, 3), "client_cpu_s": round(me1 - me0, 3),
        }
        result["send"]["emulator_cpu_us_per_msg"] = round((emu1 - emu0) / args.messages * 1e6, 1)
        print(f"send:    {args.messages} msgs in {batches} batches, {send_s:.2f}s -> "
              f"{args.messages / send_s:,.0f} msgs/s | CPU emulator {emu1 - emu0:.2f}s "
              f"({(emu1 - emu0) / args.messages * 1e6:.0f} us/msg), client {me1 - me0:.2f}s", flush=True)

        # ---------------------------------------------------------------- receive + complete
        ctx = mp.get_context("spawn")
        counter = ctx.Value("i", 0)
        done = ctx.Event()
        start_evt = ctx.Event()
        out_q = ctx.Queue()
        procs = [ctx.Process(target=_receiver, args=(conn_str, args.messages, args.prefetch, counter, done,
                                                     start_evt, out_q)) for _ in range(args.receivers)]
        for p in procs:
            p.start()
        time.sleep(3)  # let every receiver open its link (outside the measurement)
        emu0, t0 = cpu(proc.pid), time.perf_counter()
        start_evt.set()
        done.wait(timeout=max(60.0, args.messages / 100))
        t1 = time.perf_counter()
        emu1 = cpu(proc.pid)
        reports = [out_q.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        got = sum(r["received"] for r in reports)
        client_cpu = sum(r["cpu_s"] for r in reports)
        recv_s = t1 - t0
        result["receive_complete"] = {
            "seconds": round(recv_s, 3), "received": got, "msgs_per_s": round(got / recv_s, 1),
            "per_receiver": [r["received"] for r in reports],
            "emulator_cpu_s": round(emu1 - emu0, 3), "clients_cpu_s": round(client_cpu, 3),
        }
        result["receive_complete"]["emulator_cpu_us_per_msg"] = round((emu1 - emu0) / max(got, 1) * 1e6, 1)
        print(f"receive: {got} msgs received+completed by {args.receivers} receivers (prefetch {args.prefetch}), "
              f"{recv_s:.2f}s -> {got / recv_s:,.0f} msgs/s | CPU emulator {emu1 - emu0:.2f}s "
              f"({(emu1 - emu0) / max(got, 1) * 1e6:.0f} us/msg), clients {client_cpu:.2f}s", flush=True)
    finally:
        proc.stop()
    result["machine"]["loadavg_after"] = os.getloadavg()[0]
    print(f"load average (1 min) before/after: {result['machine']['loadavg_before']:.1f} / "
          f"{result['machine']['loadavg_after']:.1f} on {os.cpu_count()} CPUs (other processes compete for them)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
