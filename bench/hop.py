"""One message hop, sender to handler, with the local host's receive pattern: ``python -m bench.hop``.

A synchronous sender (as an agent's reply) sends one message at a time at random intervals; an
async receiver takes them the way ``local/host/servicebus.py`` does (one message per receive
call, prefetch 0, each handled in a task of its own that completes it, ``maxConcurrentCalls``
slots). Each hop is the time from just before the send to the handler's start. Two patterns,
run alternately: ``concurrent``, where a task's settlement may overlap the next receive call
(the host before), and ``turns``, where they take turns (``local.host.servicebus.Turns``, the
host now). Both run, as the host does, without the SDK's keep-alive reads
(``local.host.receiving.without_keep_alive_reads``). Printed, and written to ``bench/results/hop.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.emulator import QUEUE, _config
from bench.load import percentile
from local.connections import servicebus_connection_string
from local.host.receiving import RECEIVE_WAIT, Turns, without_keep_alive_reads
from local.host.settings import ServiceBusOptions
from local.procs import REPO_ROOT, Proc, free_port


def _send(conn_str: str, count: int, gap: tuple[float, float], seed: int) -> None:
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    rng = random.Random(seed)
    with ServiceBusClient.from_connection_string(conn_str) as client, client.get_queue_sender(QUEUE) as sender:
        for _ in range(count):
            time.sleep(rng.uniform(*gap))
            sender.send_messages(ServiceBusMessage(repr(time.time())))


async def _receive(conn_str: str, count: int, turns: Turns | None, slots_n: int,
                   send: threading.Thread) -> list[float]:
    from azure.servicebus import ServiceBusReceiveMode
    from azure.servicebus.aio import ServiceBusClient

    hops: list[float] = []
    tasks: set[asyncio.Task[None]] = set()
    async with ServiceBusClient.from_connection_string(conn_str) as client:
        receiver = client.get_queue_receiver(QUEUE, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0)
        lock = turns.lock if turns is not None else contextlib.nullcontext()
        async with receiver:
            slots = asyncio.Semaphore(slots_n)

            async def handle(m: Any) -> None:
                try:
                    hops.append(time.time() - float(str(m)))
                    await asyncio.sleep(0.003)  # the function's own work
                    async with lock:
                        await receiver.complete_message(m)
                finally:
                    slots.release()

            send.start()
            received = 0
            while received < count:
                await slots.acquire()
                async with lock:
                    msgs = await receiver.receive_messages(max_message_count=1, max_wait_time=RECEIVE_WAIT)
                if not msgs:
                    slots.release()
                for m in msgs:
                    received += 1
                    task = asyncio.get_running_loop().create_task(handle(m))
                    tasks.add(task)
            await asyncio.gather(*tasks)
    return hops


def run_one(conn_str: str, count: int, pattern: str, slots: int, seed: int) -> dict[str, Any]:
    send = threading.Thread(target=_send, args=(conn_str, count, (0.02, 0.12), seed), daemon=True)
    hops = asyncio.run(_receive(conn_str, count, Turns() if pattern == "turns" else None, slots, send))
    send.join(30)
    ms = [1000 * h for h in hops]
    return {"pattern": pattern, "hops": len(ms),
            **{f"p{p}_ms": round(percentile(ms, p) or 0.0, 1) for p in (50, 90, 99)},
            "max_ms": round(max(ms, default=0.0), 1), "over_100_ms": sum(1 for x in ms if x > 100)}


def _host_max_concurrent_calls() -> int:
    host = json.loads((REPO_ROOT / "host.json").read_text(encoding="utf-8"))
    return int(host.get("extensions", {}).get("serviceBus", {}).get("maxConcurrentCalls")
               or ServiceBusOptions().max_concurrent_calls)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hop", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=300, help="hops per run")
    ap.add_argument("--slots", type=int, default=_host_max_concurrent_calls(),
                    help="maxConcurrentCalls of the receiver (default: host.json's)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each pattern, alternating")
    ap.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "hop.json"))
    args = ap.parse_args(argv)
    runs = ["concurrent", "turns"] * args.rounds
    without_keep_alive_reads()  # as the local host does

    work = Path(tempfile.mkdtemp(prefix="bench-hop-"))
    cfg = work / "Config.json"
    cfg.write_text(json.dumps(_config(dedup=False)), encoding="utf-8")
    port = free_port()
    proc = Proc("servicebus", [sys.executable, "-m", "local.servicebus", "--config", str(cfg), "--host",
                               "127.0.0.1", "--port", str(port), "--data-dir", str(work / "data")]).start("ready",
                                                                                                         timeout=60)
    results = []
    try:
        conn_str = servicebus_connection_string("127.0.0.1", port)
        for i, pattern in enumerate(runs):
            r = run_one(conn_str, args.messages, pattern, args.slots, seed=i)
            results.append(r)
            print(f"{pattern:>10}: {r['hops']} hops, p50 {r['p50_ms']} ms, p90 {r['p90_ms']} ms, "
                  f"p99 {r['p99_ms']} ms, max {r['max_ms']} ms, over 100 ms: {r['over_100_ms']}", flush=True)
    finally:
        proc.stop()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"slots": args.slots, "runs": results}, indent=1), encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
