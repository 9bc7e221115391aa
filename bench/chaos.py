"""Chaos runner: drive N orders through the whole local stack while injecting counted faults.

    .venv/bin/python -m bench.chaos [--orders 2000] [--seed S] [--instances 2] [--rate 8] [--out FILE]

It starts the local stack (Azurite with a data folder, so that it can be restarted; the Service
Bus emulator; the remotes simulator; the host with ``--instances`` instances) with short step
timeouts and a fast Supervisor, posts orders at ``--rate``/s (``--digital-share`` of them the
digital workflow, ``--express-share`` the express one), and on a schedule drawn from
``random.Random(seed)`` (the seed is printed: ``--seed`` replays a run) injects SIGKILLs of host
instances, duplicate submissions and Service Bus deliveries, the remotes' faults (transient 503s,
lost responses, hangs past the step timeout, permanent rejections, one outage of shipping), one
restart of the emulator and one of Azurite; an operator terminates, restarts, fixes and cancels
orders (``bench.chaos_operator``), approvals arrive on time, early, late, twice or never
(``bench.chaos_approvals``), express orders take their own paths (``bench.chaos_express``), and
``--bulk-orders N`` retries N failed orders with one bulk operation while an instance is killed
(``bench.chaos_bulk``). Then it waits for every order to settle, turns the faults off, retries the
orders held for an operator as one would, and checks the final views, their histories, search and
the simulator's ledger, generation by generation (``bench.chaos_ledger``): every order terminal,
none lost or stuck, no effect twice, every failed order compensated exactly once, and the rest of
``evaluate``'s checks; the outage's cost is reported apart (``bench.chaos_outage``). It prints
them, writes them to ``--out`` (JSON) and exits non-zero if any check fails. Logs of every process
stay in ``--state-dir`` (default ``.local/chaos/<time>-seed<S>``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import asdict, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO, get_args, get_type_hints

import requests

from bench.chaos_approvals import Approvals, approval_outcomes, render_approvals, write_workflows
from bench.chaos_bulk import Bulk, render_bulk
from bench.chaos_express import (
    EXPRESS_WORKFLOW,
    Express,
    express_outcomes,
    express_rejections,
    plan_express,
    render_express,
)
from bench.chaos_ledger import (
    UndoTally,
    compact_history,
    compensations_repeated,
    expected_run,
    parse_time,
    split_ledger,
    step_key,
    view_effects,
)
from bench.chaos_operator import IN_FLIGHT_STATES, RAISED_LIMIT, TERMINATED_RESULTS, Operator, search_listing
from bench.chaos_outage import (
    PROCESS_FAULTS,
    BreakerSettings,
    outage_report,
    outage_window,
    render_outage,
)
from bench.chaos_records import ChaosOptions, OrderRec, is_held, is_terminal, post_until_answered
from bench.poll import wait_for
from bench.profiling import stat_fields
from local.host import ncrontab
from local.host.keys import ADMIN, FUNCTION
from local.stack import SERVICE_PATHS, Stack, demo_order
from shared.core.workflows import AGENTS_BY_NAME, DEFAULT_WORKFLOW, LEGACY_VERSION, Workflow, load_registry

SERVICES = tuple(SERVICE_PATHS.values())  # every agent's remote service (inventory, payment, shipping, delivery)
DIGITAL_WORKFLOW = "digital"  # what --digital-share of the orders name
REJECT_SKU = "SKU-OOS"  # the inventory service answers 422 "out of stock" for it
REJECT_AMOUNT_OVER = "50000"  # the payment service answers 422 for a larger charge
REJECT_UNIT_PRICE = 60000  # one of these makes an order's total exceed REJECT_AMOUNT_OVER
OUTAGE_SERVICE = "shipping"
BURST_CUSTOMER = "c-burst"  # the customer of --burst-orders

_INSTANCE_LINE = re.compile(r"\binstance (\d+) pid (\d+)\b")
SB_STATS_ENV = "LOCAL_SERVICEBUS_STATS_FILE"  # the emulator writes its per-queue counters there


# ---- views, plans and replays ----------------------------------------------------------------


def plan_workflows(orders: int, digital_share: float, seed: int | None, express_share: float = 0.0) -> list[str]:
    """The workflow each planned order names: ``round(orders * digital_share)`` of them, drawn
    from a generator of their own (the rest of a seed's plan does not change with the share),
    run the digital workflow; ``round(orders * express_share)`` of the others, drawn from another
    one (so the digital ones do not change with it), the express workflow; the rest the default."""
    n_digital = round(orders * digital_share)
    digital = set(random.Random(f"{seed}:workflows").sample(range(orders), n_digital)) if n_digital else set()
    express = plan_express(orders, express_share, seed, digital)
    return [DIGITAL_WORKFLOW if i in digital else EXPRESS_WORKFLOW if i in express else DEFAULT_WORKFLOW
            for i in range(orders)]


def view_workflow(view: dict[str, Any] | None) -> Workflow:
    """The workflow version an order's view names (``"workflow": {"name", "version"}``; none: order v1)."""
    named = (view or {}).get("workflow") or {}
    registry = load_registry()
    if not named:
        return registry.get(DEFAULT_WORKFLOW, LEGACY_VERSION)
    if named.get("version") is None:
        return registry.latest(named["name"])
    return registry.get(named["name"], int(named["version"]))


_CLI_DEFAULTS = {"out": None, "state_dir": None, "echo": False, "progress_every": None, "post_retry_seconds": None}


_NO_FLAGS = {"restart_servicebus": "--no-servicebus-restart", "restart_azurite": "--no-azurite-restart",
             "operator_retry": "--no-operator-retry", "operator_restarts": "--no-operator-restart"}


def replay_command(o: ChaosOptions) -> str:
    """The command line that replays this run's orders and fault schedule."""
    d = asdict(ChaosOptions())
    args = [".venv/bin/python -m bench.chaos", f"--seed {o.seed}", f"--orders {o.orders}"]
    for k, v in asdict(o).items():
        if k in ("seed", "orders") or k in _CLI_DEFAULTS or v == d.get(k):
            continue
        if k == "hang_seconds" and v == o.step_timeout + 3:
            continue
        if k == "kills" and v == max(2, o.orders // 200):
            continue
        if isinstance(v, bool):
            if not v:
                args.append(_NO_FLAGS[k])
            continue
        args.append(f"--{k.replace('_', '-')} {v}" if " " not in str(v) else f"--{k.replace('_', '-')} '{v}'")
    return " ".join(args)


def _alive(pid: int) -> bool:
    fields = stat_fields(f"/proc/{pid}/stat")
    return fields is not None and fields[0] != "Z"


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    wait_for(lambda: not any(_alive(p) for p in pids), timeout, every=0.1)
    return [p for p in pids if _alive(p)]


def _pct(a: int, b: int) -> float:
    return round(100.0 * a / b, 2) if b else 100.0


def _now() -> datetime:
    return datetime.now(UTC)


# ---- the runner -------------------------------------------------------------------------------


class _Aborted(Exception):
    pass


class ComponentFailed(RuntimeError):
    """A component of the stack could not be restarted: the run cannot go on and ends at once,
    with the component's last output (``python -m bench.chaos`` exits 2)."""


LAST_LINES = 30  # of a component's output, shown when its restart fails


class ChaosRun:
    def __init__(self, opts: ChaosOptions, out: TextIO = sys.stdout) -> None:
        self.o = opts.resolved()
        self.out = out
        self.rng = random.Random(self.o.seed)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.failure: str | None = None  # set when a component could not be restarted (ComponentFailed)
        self.stack: Stack | None = None
        self.recs: list[OrderRec] = []
        self.faults: Counter[str] = Counter()
        self.fault_events: list[dict[str, Any]] = []
        self.errors: list[str] = []  # infrastructure problems (the run is then not valid)
        self.poll_errors: Counter[str] = Counter()
        self.posted = 0
        self.t0 = time.monotonic()
        self.phase = "starting"
        self.durations: dict[str, float] = {}
        self._local = threading.local()
        self._sb_lock = threading.Lock()
        self._sb_client: Any = None
        self._sb_senders: dict[str, Any] = {}
        self._host_log_pos = 0
        self._host_pids: dict[int, int] = {}
        self._remote_lock = threading.Lock()  # the remotes' faults: the causes, and what is on
        self._own_causes: dict[str, dict[str, Any]] = {}
        self._chaos_on = False  # the chaos faults and the designed rejections
        self._outage_on = False
        self._sb_stats_files: list[Path] = []
        self.operator = Operator(self)
        self.approvals = Approvals(self)
        self.express = Express(self)
        self.bulk = Bulk(self)

    # ---- helpers ------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        with self.lock:
            self.out.write(text + "\n")
            self.out.flush()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def event(self, kind: str, **info: Any) -> None:
        with self.lock:
            self.fault_events.append({"t": round(self.elapsed(), 2), "at": _now().isoformat(), "kind": kind, **info})

    def session(self, level: str = FUNCTION) -> requests.Session:
        """This thread's session for routes of ``level``: the run is a client (``function``: its
        submissions, polls and histories) and an operator (``admin``: retries, search, events...)."""
        assert self.stack is not None
        sessions = getattr(self._local, "sessions", None)
        if sessions is None:
            sessions = self._local.sessions = {}
        s = sessions.get(level)
        if s is None:
            s = sessions[level] = self.stack.session(level)
            s.trust_env = False
        return s

    # ---- plan -------------------------------------------------------------------------------------

    def plan_orders(self) -> None:
        o, rng = self.o, self.rng
        n_reject = round(o.orders * o.reject_rate)
        reject_idx = set(rng.sample(range(o.orders), n_reject)) if n_reject else set()
        reject_kind = {i: ("sku" if j % 2 == 0 else "amount") for j, i in enumerate(sorted(reject_idx))}
        workflows = plan_workflows(o.orders, o.digital_share, o.seed, o.express_share)
        # each kind of designed rejection falls on express orders too (a branch refused while the other runs)
        reject_kind |= express_rejections([(i, reject_kind.get(i)) for i in range(o.orders)
                                           if workflows[i] == EXPRESS_WORKFLOW], o.reject_rate, o.seed)
        for i in range(o.orders):
            body = demo_order(rng)
            kind = reject_kind.get(i)
            if kind == "sku":  # out of stock, or no licence left: the inventory service refuses either
                body["items"].append({"sku": REJECT_SKU, "quantity": 1, "unitPrice": 5})
            elif kind == "amount":
                body["items"].append({"sku": "SKU-LUX", "quantity": 1, "unitPrice": REJECT_UNIT_PRICE})
            if workflows[i] != DEFAULT_WORKFLOW:
                body["workflow"] = workflows[i]
            self.recs.append(OrderRec(
                index=i, key=f"chaos-{o.seed}-{i}", body=body, reject=kind,
                dup_submit=rng.random() < o.duplicate_submit_rate,
                dup_delivery=rng.random() < o.duplicate_delivery_rate,
                workflow=workflows[i],
            ))

    def plan_burst(self) -> None:
        """--burst-orders orders of one customer, planned last (no other plan picks them, and the
        rest of a seed's plan does not change with them) and posted mid-run, at once."""
        o, rng = self.o, random.Random(f"{self.o.seed}:burst")
        first = max((r.index for r in self.recs), default=-1) + 1  # after the bulk's own
        burst = [OrderRec(index=first + k, key=f"chaos-{o.seed}-burst-{k}",
                          body={**demo_order(rng), "customerId": BURST_CUSTOMER}, reject=None,
                          dup_submit=False, dup_delivery=False, burst=True) for k in range(o.burst_orders)]
        middle = len(self.recs) // 2
        self.recs[middle:middle] = burst

    def plan_events(self) -> list[tuple[float, str]]:
        """(seconds after the first POST, kind) for process faults and the outage window."""
        o, rng = self.o, self.rng
        span = o.orders / o.rate
        events: list[tuple[float, str]] = []
        for _ in range(o.kills or 0):
            events.append((rng.uniform(0.05, 0.95) * span, "kill"))
        if o.outage_seconds > 0:
            start = rng.uniform(0.10, 0.20) * span
            events.append((start, "outage-start"))
            events.append((start + o.outage_seconds, "outage-end"))
        if o.restart_servicebus:
            events.append((rng.uniform(0.35, 0.45) * span, "restart-servicebus"))
        if o.restart_azurite:
            events.append((rng.uniform(0.60, 0.70) * span, "restart-azurite"))
        events.sort()
        return events

    # ---- remote faults -------------------------------------------------------------------------

    def apply_remote_faults(self) -> None:
        o = self.o
        own = self.operator.remote_causes()  # the causes of the orders the operator fixes
        # early approvals, and express orders terminated while their group runs: reservations held
        # until the event is answered, or until the terminate; express orders cancelled at their
        # shipment: shipments that never go (bench.chaos_express)
        held = [*self.approvals.held_skus(), *self.express.held_skus("groupTerminate")]
        unshipped = self.express.held_skus("pivotCancel")
        with self._remote_lock:
            self._own_causes = {svc: {} for svc in SERVICES}
            self._own_causes.update({"inventory": {"rejectSkus": [*own["restock"], *self.bulk.refused_skus()],
                                                   "hangSkus": held, "hangSeconds": o.hang_seconds},
                                     "payment": {"hangSkus": own["stall"], "hangSeconds": o.hang_seconds,
                                                 **({"rejectAmountOver": REJECT_AMOUNT_OVER} if own["limit"] else {})},
                                     "shipping": {"hangSkus": unshipped, "hangSeconds": o.hang_seconds}})
            self._chaos_on = True
            self._push(*SERVICES)

    def _push(self, *services: str) -> None:
        """(Under the remotes' lock.) Set each service to what it is owed now: the orders' own causes
        (no chaos fault: each stays until the operator, or the runner, removes it); while the chaos
        is on, its faults and the designed rejections too (delivery: the chaos faults only); during
        the outage, shipping down."""
        assert self.stack is not None
        o = self.o
        for svc in services:
            faults = dict(self._own_causes.get(svc, {}))
            if svc in o.rates():
                faults["ratePerSecond"] = o.rates()[svc]  # its published limit: on to the end
            if self._chaos_on:
                faults |= {"transientRate": o.transient_rate, "lostResponseRate": o.lost_response_rate,
                           "hangRate": o.hang_rate, "hangSeconds": o.hang_seconds}
                if svc == "inventory":
                    faults["rejectSkus"] = [REJECT_SKU, *faults["rejectSkus"]]
                if svc == "payment":
                    faults.setdefault("rejectAmountOver", REJECT_AMOUNT_OVER)
                if svc == OUTAGE_SERVICE and self._outage_on:
                    faults["down"] = True
            self.stack.remotes.set_faults(svc, **faults)

    def remote_faults_off(self) -> None:
        """Every fault off (every field back to its default), but for the causes of orders the
        operator has not fixed yet."""
        with self._remote_lock:
            self._chaos_on = False
            self._push(*SERVICES)
        self.event("remote-faults-off")

    def remove_remote_cause(self, cause: str, sku: str | None) -> None:
        """The operator's fix of one order's own cause: restock its SKU (inventory), raise the
        payment limit (under the designed rejections), or stop the payment service hanging on it;
        or the runner's release of a hold on a reservation (inventory hangs on its SKU: an early
        approval's, or an express order's that the operator terminates while its group runs)."""
        svc, field_name = {"restock": ("inventory", "rejectSkus"), "stall": ("payment", "hangSkus"),
                           "limit": ("payment", "rejectAmountOver"), "hold": ("inventory", "hangSkus")}[cause]
        with self._remote_lock:
            causes = self._own_causes[svc]
            if cause == "limit":
                causes[field_name] = RAISED_LIMIT
            else:
                causes[field_name] = [s for s in causes.get(field_name, []) if s != sku]
            self._push(svc)

    # ---- host instances ---------------------------------------------------------------------------

    def host_instances(self) -> dict[int, int]:
        """Instance -> current pid, from the host's log file (read incrementally: the in-memory
        tail of the host's output that Stack.host_instances() scans holds only 2,000 lines)."""
        assert self.stack is not None
        path = self.stack.log_dir / "host.log"
        try:
            with open(path, "rb") as f:
                f.seek(self._host_log_pos)
                chunk = f.read()
        except OSError:
            chunk = b""
        cut = chunk.rfind(b"\n") + 1  # whole lines only
        self._host_log_pos += cut
        for line in chunk[:cut].decode("utf-8", errors="replace").splitlines():
            m = _INSTANCE_LINE.search(line)
            if m and not line.startswith("[instance"):
                self._host_pids[int(m.group(1))] = int(m.group(2))
        return dict(self._host_pids)

    def _host_child(self, pid: int) -> bool:
        """pid is alive and a child of the host process we started (never kill anything else)."""
        assert self.stack is not None
        fields = stat_fields(f"/proc/{pid}/stat")
        return fields is not None and fields[0] != "Z" and int(fields[1]) == self.stack.proc("host").pid

    def kill_instance(self) -> None:
        instances = {k: p for k, p in self.host_instances().items() if self._host_child(p)}
        if not instances:
            self.errors.append(f"kill at {self.elapsed():.1f}s: no live host instance found")
            return
        k = self.rng.choice(sorted(instances))
        pid = instances[k]
        inflight = self.counts().get("Processing", 0)
        os.kill(pid, signal.SIGKILL)
        t = time.monotonic()
        self.faults["hostInstanceKills"] += 1
        self.event("kill", instance=k, pid=pid, ordersProcessing=inflight)
        self.say(f"  ! SIGKILL host instance {k} (pid {pid}) with {inflight} orders Processing")

        def restarted() -> int | None:
            new = self.host_instances().get(k)
            return new if new is not None and new != pid and self._host_child(new) else None

        new = wait_for(restarted, 60, every=0.2, stop=self.stop)
        if new is not None:
            self.event("instance-restarted", instance=k, pid=new, seconds=round(time.monotonic() - t, 2))
        elif not self.stop.is_set():
            self.errors.append(f"host instance {k} (pid {pid}) was not restarted within 60s")

    # ---- component restarts ------------------------------------------------------------------------

    def restart(self, name: str) -> None:
        assert self.stack is not None
        inflight = self.counts().get("Processing", 0)
        self.say(f"  ! restarting {name} with {inflight} orders Processing")
        t = time.monotonic()
        if name == "servicebus" and self._sb_stats_files:
            # the restarted emulator writes its counters to a new file (they restart from 0)
            path = self.o.state_dir / f"servicebus-stats-{len(self._sb_stats_files)}.json"  # type: ignore[operator]
            env = self.stack.proc("servicebus").env
            if env is not None:
                env[SB_STATS_ENV] = str(path)
                self._sb_stats_files.append(path)
        try:
            self.stack.restart(name)
        except Exception as e:  # noqa: BLE001 - whatever it was, the run cannot go on without it
            last = "\n".join(list(self.stack.proc(name).lines)[-LAST_LINES:])
            self.failure = f"restart {name}: {type(e).__name__}: {e}\n--- its last output ---\n{last}"
            self.errors.append(f"restart {name}: {e}")
            self.say(f"  ! {name} did not come back: ending the run")
            self.stop.set()  # the posts, the pollers and the waits end now
            return
        secs = round(time.monotonic() - t, 2)
        key = {"servicebus": "serviceBusEmulatorRestarts", "azurite": "azuriteRestarts"}[name]
        self.faults[key] += 1
        self.event(f"restart-{name}", seconds=secs, ordersProcessing=inflight)
        self.say(f"  ! {name} back after {secs}s")
        if name == "servicebus":
            self._drop_sb_client()

    def outage(self, on: bool) -> None:
        with self._remote_lock:
            self._outage_on = on
            self._push(OUTAGE_SERVICE)
        self.event("outage-start" if on else "outage-end", service=OUTAGE_SERVICE)
        if on:
            self.faults["shippingOutageWindows"] += 1
            self.say(f"  ! {OUTAGE_SERVICE} service down for {self.o.outage_seconds:g}s")
        else:
            self.say(f"  ! {OUTAGE_SERVICE} service back")

    def run_events(self, events: list[tuple[float, str]], start: float) -> None:
        outage = [e for e in events if e[1].startswith("outage-")]
        if outage and len(outage) < len(events):
            # The outage's own thread: a restart or a kill (waiting up to 60 s for the instance)
            # must not make the outage last longer than --outage-seconds.
            own = threading.Thread(target=self.run_events, args=(outage, start), name="outage", daemon=True)
            own.start()
            self.run_events([e for e in events if e not in outage], start)
            own.join()
            return
        for at, kind in events:
            wait = start + at - time.monotonic()
            if wait > 0 and self.stop.wait(wait):
                return
            try:
                if kind == "kill":
                    self.kill_instance()
                elif kind.startswith("outage-"):
                    self.outage(kind == "outage-start")
                else:  # restart-servicebus, restart-azurite
                    self.restart(kind.removeprefix("restart-"))
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"fault {kind}: {type(e).__name__}: {e}")

    # ---- submissions --------------------------------------------------------------------------------

    def _post(self, rec: OrderRec) -> tuple[int | None, str | None, str | None]:
        """POST rec's body with its Idempotency-Key until answered (``post_until_answered``: through
        a killed instance or a restart). A 409 (the key reused with another body) is an answer
        here, never asked again: a rejection the checks must see. -> (status, id, error)."""
        assert self.stack is not None
        status, body, lost = post_until_answered(self, f"{self.stack.api_url}/orders", FUNCTION,
                                                 again=lambda *_: False, json=rec.body,
                                                 headers={"Idempotency-Key": rec.key})
        if status in (200, 202) and body.get("orderId"):
            return status, str(body["orderId"]), None
        return status, None, f"{status} {body}" if status else f"no answer ({lost} answers lost)"

    def submit(self, rec: OrderRec) -> None:
        status, oid, err = self._post(rec)
        with self.lock:
            rec.post_status, rec.order_id, rec.post_error = status, oid, err
            if oid:
                rec.accepted_at = time.monotonic()
        if oid:
            self.approvals.accepted(rec)  # an early approval goes right after the 202

    def resubmit(self, rec: OrderRec) -> None:
        """The duplicate submission: the exact same POST again, same Idempotency-Key."""
        status, oid, err = self._post(rec)
        with self.lock:
            rec.dup_submit_done = True
            rec.dup_submit_status, rec.dup_submit_order_id = status, oid
            if status is not None:
                self.faults["duplicateSubmissions"] += 1
        if err and not oid:
            self.errors.append(f"duplicate submission of {rec.key}: {err}")

    def post_all(self, start: float) -> None:
        pool = ThreadPoolExecutor(max_workers=12, thread_name_prefix="post")
        try:
            self._paced_posts(pool, start, random.Random(f"{self.o.seed}:dup-submit"))
            pool.shutdown(wait=True)
        except BaseException:
            self.stop.set()  # let the pool's retrying workers give up at once
            # on an abort, do not wait for POSTs in flight (they give up once self.stop is set)
            pool.shutdown(wait=False, cancel_futures=True)
            raise

    def _paced_posts(self, pool: ThreadPoolExecutor, start: float, dup_rng: random.Random) -> None:
        pending_dups: list[tuple[float, OrderRec]] = []
        slot = 0  # the orders are posted at --rate, but the burst's all at once, at the slot it starts in
        for rec in self.recs:
            due = start + slot / self.o.rate
            slot += 0 if rec.burst else 1
            while True:
                now = time.monotonic()
                ready = [(t, r) for t, r in pending_dups if t <= now and r.order_id]
                for item in ready:
                    pending_dups.remove(item)
                    pool.submit(self.resubmit, item[1])
                if now >= due or self.stop.wait(min(0.05, due - now)):
                    break
            if self.stop.is_set():
                return
            pool.submit(self.submit, rec)
            self.posted += 1
            if rec.dup_submit:
                pending_dups.append((due + dup_rng.uniform(0.2, 5.0), rec))
        # the remaining duplicates (their originals must be accepted first)
        give_up = time.monotonic() + self.o.post_retry_seconds
        while pending_dups and not self.stop.is_set() and time.monotonic() < give_up:
            now = time.monotonic()
            for item in [(t, r) for t, r in pending_dups if t <= now and (r.order_id or r.post_status)]:
                pending_dups.remove(item)
                if item[1].order_id:
                    pool.submit(self.resubmit, item[1])
            self.stop.wait(0.1)

    # ---- the operator ---------------------------------------------------------------------------

    def retry_held(self) -> int:
        """POST /orders/{id}/retry for every order held for an operator (what an operator does
        once the outage is over: the retry replays the step's idempotency key and learns its
        outcome). Returns how many retries were accepted."""
        assert self.stack is not None
        with self.lock:  # (the express orders the operator cancels once held are its own)
            held = [r for r in self.recs if r.order_id and is_held(r.view) and r.express_plan != "pivotCancel"]
        if not held:
            return 0
        self.say(f"  ! {len(held)} orders held for an operator: retrying them (POST /orders/{{id}}/retry)")
        accepted = 0
        for rec in held:
            status, _, _ = post_until_answered(self, f"{self.stack.api_url}/orders/{rec.order_id}/retry")
            with self.lock:
                rec.held_retry_status = status
                if status == 202:
                    accepted += 1
                    rec.repoll()
            if status != 202:
                self.errors.append(f"operator retry of held order {rec.order_id}: HTTP {status}")
        self.faults["operatorRetriesOfHeldOrders"] += accepted
        self.event("operator-retry", orders=len(held), accepted=accepted)
        return accepted

    # ---- duplicate Service Bus deliveries -------------------------------------------------------

    def _drop_sb_client(self) -> None:
        with self._sb_lock:
            for c in [*self._sb_senders.values(), *([self._sb_client] if self._sb_client is not None else [])]:
                with suppress(Exception):
                    c.close()
            self._sb_senders.clear()
            self._sb_client = None

    def _sb_send(self, queue: str, body: dict[str, Any], *, correlation_id: str | None,
                 reply_to: str | None, ttl: timedelta | None, kind: str) -> bool:
        from azure.servicebus import ServiceBusClient, ServiceBusMessage

        assert self.stack is not None
        msg = ServiceBusMessage(
            json.dumps(body, separators=(",", ":")).encode("utf-8"),
            message_id=f"chaos-dup:{uuid.uuid4().hex}",  # a fresh id: duplicate detection lets it through
            correlation_id=correlation_id, reply_to=reply_to, subject=kind,
            content_type="application/json", time_to_live=ttl,
            application_properties={"kind": kind, "chaos": "duplicate"},
        )
        with self._sb_lock:
            try:
                if self._sb_client is None:
                    self._sb_client = ServiceBusClient.from_connection_string(
                        self.stack.servicebus_connection_string)
                sender = self._sb_senders.get(queue)
                if sender is None:
                    sender = self._sb_senders[queue] = self._sb_client.get_queue_sender(queue)
                sender.send_messages(msg)
                return True
            except Exception as e:  # noqa: BLE001  (the emulator may be restarting)
                self.poll_errors[f"duplicate send: {type(e).__name__}"] += 1
        self._drop_sb_client()
        return False

    def inject_duplicates(self, rec: OrderRec, view: dict[str, Any]) -> None:
        """Copies of this order's current agent request, or of a reply already applied."""
        assert self.stack is not None
        settings = self.stack.settings
        steps = view.get("steps") or []
        order = view.get("order") or {}
        now = _now()
        if not rec.request_copy_sent:
            workflow = view_workflow(view)
            for idx, st in enumerate(steps):
                cb = parse_time(st.get("completeBy"))
                if st.get("state") != "Running" or cb is None or cb <= now + timedelta(seconds=0.5):
                    continue
                name = st["name"]
                step = workflow.step(name)
                assert step is not None, (workflow.label, name)
                if step.kind != "call":
                    continue  # a wait or a delay has no request to copy
                attempt = int(st.get("attempt") or 1)
                context = {s["name"]: s.get("result") for s in steps[:idx] if s.get("state") == "Done"}
                key = step_key(view["orderId"], name, int(view.get("generation") or 0))
                body = {"kind": "step", "orderId": view["orderId"], "step": name, "operation": step.operation,
                        "attempt": attempt, "idempotencyKey": key,
                        "completeBy": st["completeBy"],
                        "order": {"customerId": order.get("customerId"), "currency": order.get("currency"),
                                  "total": order.get("total"), "items": order.get("items")},
                        "context": context, "workflow": workflow.name, "workflowVersion": workflow.version}
                queue = settings[AGENTS_BY_NAME[step.agent].queue_setting]
                if self._sb_send(queue, body, correlation_id=f"{view['orderId']}:{name}:{attempt}",
                                 reply_to=settings["RepliesQueue"], ttl=cb - now, kind="step"):
                    rec.request_copy_sent, rec.request_copy_step = True, name
                    self.faults["duplicateRequestDeliveries"] += 1
                break
        if not rec.reply_copy_sent:
            # an agent's reply: of a call (a wait or a delay has no agent, so no reply to copy)
            done = [s for s in steps if s.get("state") == "Done" and s.get("kind", "call") == "call"]
            if done:
                st = done[-1]
                attempt = int(st.get("attempt") or 1)
                body = {"kind": "step", "orderId": view["orderId"], "step": st["name"], "attempt": attempt,
                        "outcome": "success", "result": st.get("result") or {}, "reason": None}
                # a branch's reply while another branch of its group still runs (not the group's last)
                in_group = bool(st.get("group")) and any(
                    s.get("group") == st["group"] and s.get("state") in ("Running", "Waiting") for s in steps)
                if self._sb_send(settings["RepliesQueue"], body,
                                 correlation_id=f"{view['orderId']}:{st['name']}:{attempt}",
                                 reply_to=None, ttl=None, kind="step"):
                    rec.reply_copy_sent, rec.reply_copy_step, rec.reply_copy_in_group = True, st["name"], in_group
                    self.faults["duplicateReplyDeliveries"] += 1

    # ---- polling ---------------------------------------------------------------------------------

    def _get(self, order_id: str) -> tuple[int | None, dict[str, Any] | None]:
        assert self.stack is not None
        try:
            r = self.session(FUNCTION).get(f"{self.stack.api_url}/orders/{order_id}", timeout=15)
        except requests.RequestException as e:
            self.poll_errors[type(e).__name__] += 1
            return None, None
        if r.status_code == 200:
            try:
                return 200, dict(r.json())
            except ValueError:
                self.poll_errors["bad json"] += 1
                return 200, None
        if r.status_code != 404:
            self.poll_errors[f"HTTP {r.status_code}"] += 1
        return r.status_code, None

    def _poll_one(self, rec: OrderRec) -> None:
        assert rec.order_id is not None
        _, view = self._get(rec.order_id)
        if view is None:
            return
        with self.lock:
            rec.view = view
        if rec.dup_delivery and not (rec.request_copy_sent and rec.reply_copy_sent) and not self.stop.is_set():
            try:
                self.inject_duplicates(rec, view)
            except Exception as e:  # noqa: BLE001
                self.poll_errors[f"inject: {type(e).__name__}"] += 1

    def poll_loop(self) -> None:
        """GET orders that are due, each on its own backoff (2 s after acceptance, then up to
        every 8 s; 3 s once submissions are over), so polling stays a small share of the load.
        Orders picked for duplicate deliveries are polled every 0.5 s until their copies went, and
        so are the orders the operator watches (``Operator.watching``)."""
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="poll") as pool:
            while not self.stop.is_set():
                now = time.monotonic()
                with self.lock:
                    due = [r for r in self.recs if r.order_id and (not is_terminal(r.view) or self.bulk.behind(r))
                           and (r.next_poll or (r.accepted_at or now) + 2.0) <= now]
                due.sort(key=lambda r: r.next_poll)
                due = due[:80]
                if due:
                    list(pool.map(self._poll_one, due))
                    cap = 8.0 if self.phase == "chaos" else 3.0
                    now = time.monotonic()
                    with self.lock:
                        for r in due:
                            if (r.dup_delivery and not (r.request_copy_sent and r.reply_copy_sent)
                                    or self.operator.watching(r) or self.approvals.watching(r)
                                    or self.bulk.watching(r)):
                                r.poll_interval = 0.5
                            else:
                                r.poll_interval = min(cap, max(2.0, r.poll_interval * 1.5))
                            r.next_poll = now + r.poll_interval
                self.stop.wait(0.25)

    def counts(self) -> Counter[str]:
        with self.lock:
            return Counter(r.state or "Pending" for r in self.recs if r.order_id)

    def accepted(self) -> list[OrderRec]:
        with self.lock:
            return [r for r in self.recs if r.order_id]

    def all_settled(self) -> bool:
        with self.lock:
            unanswered = any(r.order_id is None and r.post_status is None for r in self.recs[: self.posted])
            return (not unanswered and self.posted >= len(self.recs) and not self.bulk.pending()
                    and all(is_terminal(r.view) and not self.operator.pending(r) and not self.approvals.pending(r)
                            and not self.bulk.behind(r) for r in self.recs if r.order_id))

    def say_unsettled(self, most: int = 5) -> None:
        """Why the run is not settled: the first orders it waits for, and what each is owed."""
        with self.lock:
            waits = [(r, [why for why, owed in (("not terminal", not is_terminal(r.view)),
                                                 ("operator", self.operator.pending(r)),
                                                 ("approvals", self.approvals.pending(r)),
                                                 ("bulk", self.bulk.behind(r))) if owed])
                     for r in self.recs if r.order_id]
            waits = [(r, why) for r, why in waits if why]
        self.say(f"not settled: {len(waits)} orders" + (", bulk operation pending" if self.bulk.pending() else ""))
        for r, why in waits[:most]:
            self.say(f"  {r.order_id} ({(r.view or {}).get('processState')}, {r.workflow}): {', '.join(why)}")

    def progress_line(self) -> str:
        c = self.counts()
        acc = sum(c.values())
        done = c["Processed"] + c["Error"]
        f = self.faults
        return (f"[{self.elapsed():6.1f}s {self.phase:>8}] posted {self.posted}/{len(self.recs)} accepted {acc} | "
                f"Pending {c['Pending']} Processing {c['Processing']} Processed {c['Processed']} Error {c['Error']}"
                f" (terminal {done}) | kills {f['hostInstanceKills']} sbRestarts {f['serviceBusEmulatorRestarts']}"
                f" azRestarts {f['azuriteRestarts']} dupPOST {f['duplicateSubmissions']}"
                f" dupMsg {f['duplicateRequestDeliveries'] + f['duplicateReplyDeliveries']}"
                f" | terminated {f['operatorTerminates']} restarted {f['operatorRestarts']}"
                f" redriven {f['operatorCompensationRedrives']} | events {f['approvalEventsSent']}"
                f" | pollErr {sum(self.poll_errors.values())}")

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        if wait_for(predicate, timeout, stop=self.stop):
            return True
        if self.stop.is_set():
            raise _Aborted()
        return False

    # ---- main sequence ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        o = self.o
        self.say(f"chaos run: seed {o.seed} (replay with --seed {o.seed}), {o.orders} orders at {o.rate:g}/s, "
                 f"{o.instances} host instances, StepTimeoutSeconds {o.step_timeout}, "
                 f"SupervisorSchedule '{o.supervisor_schedule}'")
        self.say(f"state and logs: {o.state_dir}")
        self.plan_orders()
        events = self.plan_events()  # (the plans below draw from generators of their own)
        self.operator.plan()
        self.express.plan(events)
        self.approvals.plan()
        self.recs[:0] = self.bulk.plan()  # posted first: they fail while the others run, then are retried
        self.plan_burst()
        assert o.state_dir is not None  # set by ChaosOptions.resolved()
        # The run's own workflows: a wait of a day would not end within it (bench.chaos_approvals).
        workflows_dir = o.state_dir / "workflows"
        waits = write_workflows(workflows_dir, o.approval_timeout)
        self.say(f"workflows: {workflows_dir} (wait steps: {waits})")
        overrides = {
            "StepTimeoutSeconds": str(o.step_timeout),
            "SupervisorSchedule": o.supervisor_schedule,
            "UnclaimedGraceSeconds": str(max(3, o.step_timeout)),
            "BackoffBaseSeconds": "1",
            "WorkflowsPath": str(workflows_dir),
        }
        if o.bulk_orders:
            overrides["BulkOrdersPerTick"] = str(o.bulk_per_tick)
        if o.rate_limits:
            overrides["RemoteRateLimits"] = o.rate_limits
        if o.customer_max_in_flight:
            overrides["CustomerMaxInFlight"] = str(o.customer_max_in_flight)
        self.stack = Stack(o.state_dir, persistent=True, instances=o.instances, settings_overrides=overrides,
                           remotes_seed=o.seed or 0, echo=o.echo)
        threads: list[threading.Thread] = []
        progress_stop = threading.Event()
        try:
            t = time.monotonic()
            self._start_stack()
            self.durations["stackStartSeconds"] = round(time.monotonic() - t, 2)
            self.host_instances()
            self.say(f"stack up in {self.durations['stackStartSeconds']}s: {self.stack.api_url}")
            self.approvals.check_stack()
            self.apply_remote_faults()

            def progress() -> None:
                while not progress_stop.wait(o.progress_every):
                    self.say(self.progress_line())

            threads.append(threading.Thread(target=progress, name="progress", daemon=True))
            threads.append(threading.Thread(target=self.poll_loop, name="poller", daemon=True))
            threads += [threading.Thread(target=part.loop, name=part.name, daemon=True)
                        for part in (self.operator, self.approvals, self.bulk)]
            for th in threads:
                th.start()

            self.phase = "chaos"
            start = time.monotonic()
            t_run = time.monotonic()
            fault_thread = threading.Thread(target=self.run_events, args=(events, start), name="faults",
                                            daemon=True)
            fault_thread.start()
            self.post_all(start)
            fault_thread.join()
            self.durations["submitSeconds"] = round(time.monotonic() - start, 2)

            self.phase = "settle"
            settled = self.wait_until(self.all_settled, o.settle_timeout)
            self.remote_faults_off()
            self.phase = "drain"
            if not settled and not self.wait_until(self.all_settled, o.drain_timeout):
                self.say_unsettled()
            if o.operator_retry:
                self.phase = "operator"
                if self.retry_held() and not self.wait_until(self.all_settled, o.drain_timeout):
                    self.say_unsettled()
            self.durations["processSeconds"] = round(time.monotonic() - t_run, 2)
            self.phase = "verify"
            progress_stop.set()
            self.stop.set()
            for th in threads:
                th.join(timeout=30)
            self.say(self.progress_line())
            report = self.verify()
        except (_Aborted, KeyboardInterrupt):
            self.say("aborted: stopping the stack ...")
            if self.failure is not None:
                raise ComponentFailed(self.failure) from None
            raise
        finally:
            progress_stop.set()
            self.stop.set()
            self._drop_sb_client()
            pids = self.started_pids()
            t = time.monotonic()
            self.stack.stop()
            self.durations["stackStopSeconds"] = round(time.monotonic() - t, 2)
        self.durations["totalSeconds"] = round(self.elapsed(), 2)
        report["durations"] = self.durations
        orphans = _wait_gone(pids, 10.0)
        report["appObserved"] = self.app_events()
        report["limits"] = limits_section(self.o, self.recs, report["remotes"]["stats"], report["appObserved"])
        report["faults"]["serviceBus"] = self.servicebus_counts()
        report["processes"] = {"started": pids, "aliveAfterStop": orphans}
        report["checks"]["orphanProcesses"] = {"value": len(orphans), "expected": 0, "ok": not orphans}
        report["ok"] = report["ok"] and not orphans
        return report

    def _start_stack(self) -> None:
        """Start the stack, the emulator writing its counters into the state folder."""
        assert self.stack is not None
        path = self.o.state_dir / "servicebus-stats-0.json"  # type: ignore[operator]
        old = os.environ.get(SB_STATS_ENV)
        os.environ[SB_STATS_ENV] = str(path)  # only while the children start: they copy it
        try:
            self.stack.start()
        finally:
            if old is None:
                os.environ.pop(SB_STATS_ENV, None)
            else:
                os.environ[SB_STATS_ENV] = old
        self._sb_stats_files.append(path)

    def servicebus_counts(self) -> dict[str, Any]:
        """The emulator's own counters, summed over its restarts: redeliveries (a lock that
        expired, e.g. held by a killed instance; an abandon; a release), duplicates dropped by
        duplicate detection, dead-letters."""
        if not self._sb_stats_files:
            return {"available": False}
        per_queue: dict[str, Counter[str]] = defaultdict(Counter)
        read = 0
        for path in self._sb_stats_files:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            read += 1
            for q, ops in (data.get("queues") or {}).items():
                for k, v in ops.items():
                    if isinstance(v, int):
                        per_queue[q][k] += v
        total: Counter[str] = sum(per_queue.values(), Counter())
        return {
            "available": True, "files": read, "emulatorProcesses": len(self._sb_stats_files),
            "redeliveries": total["lock_expired"] + total["abandoned"] + total["released"],
            "lockExpired": total["lock_expired"], "abandoned": total["abandoned"], "released": total["released"],
            "duplicatesDropped": total["duplicates"], "deadLettered": total["deadlettered"],
            "delivered": total["delivered"], "sent": total["sent"],
            "perQueue": {q: dict(c) for q, c in sorted(per_queue.items())},
        }

    def app_events(self) -> dict[str, int]:
        """How often the app logged each event (host.log): duplicates and stale messages it
        recognised, lost races, redrives, expiries... evidence that the faults reached it."""
        assert self.stack is not None
        counts: Counter[str] = Counter()
        pattern = re.compile(rb'"event":"([A-Za-z0-9_.]+)"')
        with suppress(OSError), open(self.stack.log_dir / "host.log", "rb") as f:
            counts.update(m.group(1).decode() for line in f if (m := pattern.search(line)))
        return dict(sorted(counts.items()))

    def started_pids(self) -> list[int]:
        """Every process of the stack this run started (components, and host instances seen)."""
        assert self.stack is not None
        pids = []
        for name in ("azurite", "servicebus", "remotes", "host"):
            try:
                p = self.stack.proc(name)
                if p.popen is not None:
                    pids.append(p.pid)
            except (KeyError, AssertionError):
                pass
        self.host_instances()
        pids += [e["pid"] for e in self.fault_events if e.get("kind") in ("kill", "instance-restarted")]
        pids += list(self._host_pids.values())
        return sorted(set(pids))

    # ---- verification ----------------------------------------------------------------------------

    def _final_views(self) -> dict[str, tuple[int | None, dict[str, Any] | None]]:
        recs = self.accepted()
        out: dict[str, tuple[int | None, dict[str, Any] | None]] = {}

        def one(rec: OrderRec) -> None:
            assert rec.order_id is not None
            status, view = None, None
            for _ in range(5):
                status, view = self._get(rec.order_id)
                if status in (200, 404) and (status == 404 or view is not None):
                    break
                time.sleep(1)
            out[rec.order_id] = (status, view)

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(one, recs))
        return out

    def verify(self) -> dict[str, Any]:
        assert self.stack is not None
        o = self.o
        now = _now()
        views = self._final_views()
        listing, search_problems = search_listing(self.session(ADMIN), self.stack.api_url)
        self.errors += search_problems
        remotes = self.stack.remotes
        ledger = remotes.ledger()
        stats = remotes.stats()
        sweep = 2 * ncrontab.parse(o.supervisor_schedule).min_interval().total_seconds() + 1
        histories = {oid: self._full_history(oid, view) for oid, (status, view) in views.items()
                     if status == 200 and view}

        checks, summary, examples = evaluate(self.recs, views, ledger, now=now, sweep_seconds=sweep,
                                             errors=self.errors, held_allowed=not o.operator_retry,
                                             listing=listing, histories=histories)
        faults = self.fault_counts(stats)
        examples["orderNotes"] = self.order_notes(examples, views)
        approvals = {"timeoutSeconds": self.approvals.timeouts, **summary.pop("approvals")}
        express = summary.pop("express")
        bulk = self.bulk.report(views, histories) if self.bulk.recs else {}
        checks.update(bulk.get("checks", {}))
        examples.update(bulk.get("examples", {}))
        report = {
            "ok": all(c["ok"] for c in checks.values()),
            "seed": o.seed,
            "replay": replay_command(o),
            "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(o).items()},
            "orders": {"planned": o.orders, **summary},
            "checks": checks,
            "faults": faults,
            "faultEvents": self.fault_events,
            "approvals": approvals,
            "express": express,
            "bulk": bulk,
            "outage": self.outage_section(views, stats, histories),
            "remotes": {"effects": len(ledger), "stats": stats},
            "pollErrors": dict(self.poll_errors),
            "infrastructureErrors": self.errors,
            "examples": examples,
            "stateDir": str(o.state_dir),
        }
        return report

    def outage_section(self, views: dict[str, tuple[int | None, dict[str, Any] | None]],
                       stats: dict[str, Any], full: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        """The outage report (bench.chaos_outage): calls to the dead remote, FailureCount
        increments, orders held and the drain, from the simulator's journal and the histories."""
        assert self.stack is not None
        window = outage_window(stats.get("downWindows") or [], OUTAGE_SERVICE)
        if window is None:
            return outage_report(None, [], {}, BreakerSettings(0, 0), [])
        process_faults = [e["at"] for e in self.fault_events if e["kind"] in PROCESS_FAULTS]
        try:
            calls = self.stack.remotes.calls(service=OUTAGE_SERVICE)
        except Exception as e:  # noqa: BLE001  (an older simulator: no journal)
            self.errors.append(f"outage report: the simulator's call journal: {e}")
            calls = []
        histories = {oid: (view, full[oid]) for oid, (status, view) in views.items() if status == 200 and view}
        try:
            with open(self.stack.log_dir / "host.log", encoding="utf-8", errors="replace") as log:
                return outage_report(window, calls, histories, BreakerSettings.from_settings(self.stack.settings), log,
                                     process_faults)
        except OSError:
            return outage_report(window, calls, histories, BreakerSettings.from_settings(self.stack.settings), [],
                                 process_faults)

    def _full_history(self, order_id: str, view: dict[str, Any]) -> list[dict[str, Any]]:
        """The view's history, and its further pages (GET /orders/{id}/history) if it has more."""
        assert self.stack is not None
        history, token = list(view.get("history") or []), view.get("historyContinuationToken")
        while token:
            try:
                r = self.session(FUNCTION).get(f"{self.stack.api_url}/orders/{order_id}/history",
                                               params={"limit": 1000, "continuationToken": token}, timeout=30)
                page = r.json() if r.status_code == 200 else {}
            except (requests.RequestException, ValueError):
                page = {}
            if not page:
                self.errors.append(f"history of {order_id}: a page could not be read")
                break
            history += page.get("history") or []
            token = page.get("continuationToken")
        return history

    def order_notes(self, examples: dict[str, Any], views: dict[str, Any]) -> dict[str, Any]:
        """Each order named in the examples: its final view in short, and its record (what the runner
        planned and did to it, but for its body and last view)."""
        named: set[str] = set()
        for v in examples.values():
            for item in v if isinstance(v, list) else []:
                if isinstance(item, str):
                    named.add(item)
                elif isinstance(item, dict) and isinstance(item.get("orderId"), str):
                    named.add(item["orderId"])
        notes = {}
        for r in self.recs:
            if r.order_id in named:
                view = (views.get(r.order_id) or (None, None))[1] or r.view or {}
                record = {k: v for k, v in asdict(r).items() if k not in ("body", "view") and v not in (None, 0, [])}
                notes[r.order_id] = {
                    **{k: view.get(k) for k in ("processState", "outcome", "reason", "failureCount", "generation",
                                                "category")},
                    "steps": [{**{k: s.get(k) for k in ("name", "state", "attempt", "group", "finishedAt",
                                                       "failureReason")},
                               "compensation": (s.get("compensation") or {}).get("state")}
                              for s in view.get("steps") or []],
                    "record": record, "history": compact_history(view),
                }
        return notes

    def fault_counts(self, stats: dict[str, Any]) -> dict[str, Any]:
        """Injected faults. Process faults and duplicates are counted as they are injected; the
        remotes' faults come from their /_stats."""
        f: dict[str, Any] = dict(self.faults)
        for k in ("hostInstanceKills", "serviceBusEmulatorRestarts", "azuriteRestarts", "duplicateSubmissions",
                  "duplicateRequestDeliveries", "duplicateReplyDeliveries", "shippingOutageWindows",
                  "operatorTerminates", "operatorRestarts", "operatorCompensationRedrives", "operatorFixedCauses",
                  "operatorCancels", "approvalEventsSent"):
            f.setdefault(k, 0)
        f["duplicateDeliveries"] = f["duplicateRequestDeliveries"] + f["duplicateReplyDeliveries"]
        req = stats.get("requests", {})

        def status_count(svc: str, op: str | None, status: str) -> int:
            ops = req.get(svc, {})
            return sum(v.get(status, 0) for name, v in ops.items() if op is None or name == op)

        f["permanentRejections"] = {
            "ordersDesigned": sum(1 for r in self.recs if r.reject),
            "reserve422": status_count("inventory", "reserve", "422")
            + status_count("inventory", "reserve-licence", "422"),
            "charge422": status_count("payment", "charge", "422"),
        }
        f["remote503"] = {svc: status_count(svc, None, "503") for svc in SERVICES}
        f["remoteCalls"] = {svc: sum(sum(v.values()) for v in req.get(svc, {}).values()) for svc in SERVICES}
        f["remoteReplays"] = stats.get("replays", {})
        f["remoteInjected"] = stats.get("injected", {})  # counted by the simulator as it applies each fault
        return f


def evaluate(recs: list[OrderRec], views: dict[str, tuple[int | None, dict[str, Any] | None]],
             ledger: list[dict[str, Any]], *, now: datetime, sweep_seconds: float,
             errors: list[str] | None = None, held_allowed: bool = False,
             listing: dict[str, list[str]] | None = None,
             histories: dict[str, list[dict[str, Any]]] | None = None,
             ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The end-of-run checks, from the orders' final views (``order id -> (HTTP status, body)``)
    and the simulator's ledger; with ``listing`` (search state -> order ids listed, every
    page), also what an operator finds by search; ``histories``: each order's whole history
    (else its view's first page), for the approvals' checks. -> (checks, order summary, examples)."""
    errors = errors or []
    accepted = [r for r in recs if r.order_id]
    ids = {r.order_id for r in accepted if r.order_id}
    sweep = sweep_seconds
    states: Counter[str] = Counter()
    terminal: list[str] = []
    lost: list[str] = []
    stuck: list[str] = []
    not_found: list[str] = []
    for r in accepted:
        assert r.order_id is not None
        status, view = views.get(r.order_id, (None, None))
        if status == 404:
            not_found.append(r.order_id)
            lost.append(r.order_id)
            states["NotFound"] += 1
            continue
        if view is None:
            view = r.view  # the last view seen while polling
        states[(view or {}).get("processState") or "Unknown"] += 1
        if is_terminal(view):
            terminal.append(r.order_id)
            continue
        lost.append(r.order_id)  # accepted but never terminal
        cb = parse_time((view or {}).get("completeBy"))
        if cb is None or cb + timedelta(seconds=sweep) < now:
            stuck.append(r.order_id)

    fx = ledger_outcomes(ids, views, ledger)
    op = operator_outcomes(accepted, views)
    search_wrong = search_mismatches(ids, views, listing) if listing is not None else []
    ap = approval_outcomes(accepted, views, ledger, histories)
    ex = express_outcomes(accepted, views, ledger, histories)

    dup_mismatch = [{"key": r.key, "orderId": r.order_id, "replayOrderId": r.dup_submit_order_id,
                     "replayStatus": r.dup_submit_status}
                    for r in accepted if r.dup_submit_done and r.dup_submit_order_id != r.order_id]
    rejected_unexpectedly = [{"key": r.key, "status": r.post_status, "error": r.post_error}
                             for r in recs if r.post_status is not None and r.order_id is None]
    never_answered = [r.key for r in recs if r.post_status is None]

    n_acc = len(accepted)
    n_fwe, n_comp = len(fx["failedWithEffects"]), len(fx["fullyCompensated"])
    # every check that counts orders (or effects) that must not be: (its check, its examples' key)
    none_of: list[tuple[str, list[Any], str | None]] = [
        ("lostOrders", lost, "lost"), ("stuckOrders", stuck, "stuck"),
        ("doubleEffects", fx["doubleEffects"], "doubleEffects"),
        ("compensationsAppliedMoreThanOnce", fx["compMulti"], "compensationMultiple"),
        ("processedOrdersWithWrongEffects", fx["processedWrong"], "processedWrong"),
        ("failedOrdersThatShipped", fx["shipped"], "failedShipped"),
        ("duplicateSubmissionsGivingAnotherOrder", dup_mismatch, "duplicateSubmissionMismatch"),
        ("submissionsRejected", rejected_unexpectedly, "submissionsRejected"),
        ("submissionsNeverAnswered", never_answered, "neverAnswered"),
        ("effectsOfUnknownOrders", fx["foreign"], "unknownOrders"),
        ("ordersLeftHeldForAnOperator", fx["held"], "held"),
        # the operator's actions (issue 11) and the generations of restarted orders
        ("effectsWithUnexpectedKeys", fx["unexpectedKeys"], "unexpectedKeys"),
        ("generationsNotFromAnOperatorRestart", op["generationWrong"], "generationWrong"),
        ("terminatedOrdersNotEndedAsTerminated", op["terminateWrong"], "terminateWrong"),
        ("ordersTerminatedWithoutAnOperator", op["terminatedWithoutOperator"], "terminatedWithoutOperator"),
        ("terminatesRefusedInFlight", op["terminateRefusedInFlight"], "terminateRefusedInFlight"),
        ("operatorRetriesRefused", op["retryRefused"], "retryRefused"),
        ("ordersSearchListsWrongly", search_wrong, "searchWrong"),
        # the approvals (issue 29): bench.chaos_approvals
        ("approvalPlansNotAsWaited", ap["planMismatch"], "approvalPlanMismatch"),
        ("approvalEventAnswersUnexpected", ap["answersWrong"], "approvalAnswersWrong"),
        ("approvalWaitsEndedTwice", ap["stepRunTwice"], "approvalWaitEndedTwice"),
        ("approvedOrdersNotProcessed", ap["approvedNotProcessed"], "approvedNotProcessed"),
        ("declinedOrTimedOutOrdersCharged", ap["refusedCharged"], "declinedOrTimedOutCharged"),
        ("declinedOrTimedOutOrdersNotUndone", ap["refusedNotUndone"], "declinedOrTimedOutNotUndone"),
        # express orders, a parallel step (issue 29): bench.chaos_express
        ("expressOrdersNotRunAsExpress", ex["notExpress"], "expressNotExpress"),
        ("expressCompensationsOutOfOrder", ex["outOfOrder"], "expressOutOfOrder"),
        ("expressFailedOrdersWithBranchEffectsStanding", ex["standing"], "expressStanding"),
        ("expressBranchesNotCompensatedByKey", ex["byKey"], "expressNotByKey"),
        ("infrastructureErrors", errors, None),
    ]
    checks: dict[str, dict[str, Any]] = {
        "terminalPercent": {"value": _pct(len(terminal), n_acc), "expected": 100.0,
                            "ok": len(terminal) == n_acc and n_acc > 0},
        "failedOrdersFullyCompensatedPercent": {"value": _pct(n_comp, n_fwe), "expected": 100.0,
                                                "ok": n_comp == n_fwe},
        **{name: {"value": len(items), "expected": 0, "ok": not items} for name, items, _ in none_of},
    }
    checks["ordersLeftHeldForAnOperator"]["ok"] |= held_allowed
    summary = {"accepted": n_acc, "finalStates": dict(states), "failed": len(fx["failedOrders"]),
               "workflows": dict(Counter(r.workflow for r in accepted)),
               "heldForAnOperator": len(fx["held"]),
               "operatorRetried": sum(1 for r in accepted if r.held_retry_status == 202),
               "failedWithEffectsToCompensate": n_fwe,
               "compensationsNeeded": fx["undo"].needed, "compensationsApplied": fx["undo"].applied,
               "compensationsOfNothing": fx["compensationsOfNothing"],
               "designedRejections": sum(1 for r in recs if r.reject),
               "operator": {**op["counts"], **fx["generationCounts"]}, "approvals": ap["summary"],
               "express": ex["summary"]}
    examples = {key: items[:20] for _, items, key in none_of if key} | {
        "notFound": not_found[:20], "compensationMissing": fx["undo"].missing[:20],
        "nonTerminalViews": [views[oid][1] for oid in lost[:5] if views.get(oid)]}
    return checks, summary, examples


def ledger_outcomes(ids: set[str], views: dict[str, tuple[int | None, dict[str, Any] | None]],
                    ledger: list[dict[str, Any]]) -> dict[str, Any]:
    """The ledger against the orders' final views, generation by generation (bench.chaos_ledger).

    Effects per (service, key): a key applied twice is a double effect. Per order: every
    generation before the order's last is undone; the last one, if Processed, applied each
    step exactly once and compensated nothing; if Error (and not held), is undone. A
    ``tombstone`` entry records a compensation that found nothing to undo (the step timed out
    without its effect): it is not an effect."""
    per_key = Counter((e["service"], e["idempotencyKey"]) for e in ledger)
    double_effects = [{"service": s, "idempotencyKey": k, "times": n} for (s, k), n in per_key.items() if n > 1]
    # Each order against its own workflow's steps (the one its view names; none: order v1).
    steps_of = {oid: view_effects(v if s == 200 else None) for oid, (s, v) in views.items()}
    per_order, unexpected = split_ledger(ledger, steps_of)
    foreign = sorted(set(per_order) - ids)
    unexpected = [u for u in unexpected if u["orderId"] in ids]

    final_state = {oid: ((v or {}).get("processState") if s == 200 else None) for oid, (s, v) in views.items()}
    last_gen = {oid: int((v or {}).get("generation") or 0) for oid, (s, v) in views.items() if s == 200 and v}
    held = sorted(oid for oid, (s, v) in views.items() if s == 200 and oid in ids and is_held(v))
    undo, processed_wrong, comp_multi = UndoTally(), [], []
    failed_last_with_effects: set[str] = set()
    earlier, earlier_with_effects = 0, 0
    for oid in sorted(ids):
        fx = per_order[oid]
        expected = expected_run(fx.steps)
        compensable = {(svc, op) for svc, op, comp in fx.steps.values() if comp}
        comp_multi += compensations_repeated(oid, fx)
        last = last_gen.get(oid, 0)
        for g in sorted(fx.generations()):
            if g > last:
                unexpected.append({"orderId": oid, "generation": g,
                                   "problem": f"effects of generation {g}; the order is at generation {last}"})
        for g in range(last):  # earlier generations: each one failed, and was undone before the restart
            earlier += 1
            earlier_with_effects += any(fx.effects[g].get(e) for e in compensable)
            undo.check_undone(oid, fx, g)
        effects, tomb = fx.effects[last], fx.tombstones[last]
        if final_state.get(oid) == "Processed":
            if effects != expected or tomb:
                processed_wrong.append({"orderId": oid, "generation": last,
                                        "effects": {f"{s}/{p}": n for (s, p), n in effects.items()},
                                        "tombstones": {f"{s}/{p}": n for (s, p), n in tomb.items()}})
            continue
        if final_state.get(oid) != "Error":
            continue
        if any(effects.get(e) for e in compensable):
            failed_last_with_effects.add(oid)
        if oid not in held:  # nothing is compensated while an operator decides
            undo.check_undone(oid, fx, last)
    failed_with_effects = sorted(failed_last_with_effects | undo.orders_with_effects)
    missing = {m["orderId"] for m in undo.missing}
    restarted = [oid for oid in ids if last_gen.get(oid, 0) > 0]
    return {
        "doubleEffects": double_effects, "foreign": foreign, "unexpectedKeys": unexpected, "held": held,
        "undo": undo, "shipped": undo.shipped, "processedWrong": processed_wrong, "compMulti": comp_multi,
        "failedOrders": [oid for oid in ids if final_state.get(oid) == "Error"],
        "failedWithEffects": failed_with_effects,
        "fullyCompensated": [oid for oid in failed_with_effects if oid not in missing],
        "compensationsOfNothing": sum(sum(c.values()) for o, fx in per_order.items() if o in ids
                                      for c in fx.tombstones.values()),
        "generationCounts": {
            "restartedOrders": len(restarted),
            "restartedThenProcessed": sum(1 for oid in restarted if final_state.get(oid) == "Processed"),
            "restartedAndFailedAgain": sum(1 for oid in restarted if final_state.get(oid) == "Error"),
            "highestGeneration": max(last_gen.values(), default=0),
            "earlierGenerationsUndone": earlier,
            "earlierGenerationsWithEffectsUndone": earlier_with_effects,
        },
    }


def search_mismatches(ids: set[str], views: dict[str, tuple[int | None, dict[str, Any] | None]],
                      listing: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Orders search does not list under their category (the one their own view shows), or
    lists under another, or more than once."""
    where: dict[str, list[str]] = defaultdict(list)
    for state, listed in listing.items():
        for oid in listed:
            where[oid].append(state)
    wrong = []
    for oid in sorted(ids):
        status, view = views.get(oid, (None, None))
        category = (view or {}).get("category") if status == 200 else None
        if category is None:
            continue  # lost: another check says so
        if where.get(oid, []) != [category]:
            wrong.append({"orderId": oid, "category": category, "listedUnder": where.get(oid, []),
                          "processState": (view or {}).get("processState"), "outcome": (view or {}).get("outcome")})
    return wrong


def operator_outcomes(accepted: list[OrderRec],
                      views: dict[str, tuple[int | None, dict[str, Any] | None]]) -> dict[str, Any]:
    """What the operator's actions came to: a terminated order ends Error ``terminated`` (its
    effects are undone: ``ledger_outcomes``), or held and retried (or cancelled, as planned for
    it); no order is ``terminated`` or ``cancelled`` that the operator did not terminate or
    cancel; a terminate is refused only for an order out of flight; a restart, redrive or cancel
    the operator asks for is done; an order's generation is the number of its restarts."""
    terminate_wrong, spurious, refused_in_flight, retry_refused, generation_wrong = [], [], [], [], []
    for r in accepted:
        status, final = views.get(r.order_id or "", (None, None))
        view = final or r.view or {}
        outcome, state = view.get("outcome"), view.get("processState")
        who = {"orderId": r.order_id, "processState": state, "outcome": outcome}
        if r.terminate_status == 202:
            if r.terminate_result in TERMINATED_RESULTS:
                if not (state == "Error" and outcome == "terminated"):
                    terminate_wrong.append({**who, "terminate": r.terminate_result, "expected": "terminated"})
            elif r.terminate_result == "held":
                cancelled = r.cancel_status == 202 and outcome == "cancelled"  # the operator's plan (pivotCancel)
                if not (is_held(view) or r.held_retry_status == 202 or cancelled):
                    terminate_wrong.append({**who, "terminate": "held", "expected": "held, retried, or cancelled"})
            else:
                terminate_wrong.append({**who, "terminate": r.terminate_result, "expected": "a known result"})
        if outcome == "terminated" and r.terminate_status != 202 and not r.terminate_lost:
            spurious.append({**who, "terminateStatus": r.terminate_status})
        if outcome == "cancelled" and r.cancel_status != 202 and not r.cancel_lost:
            spurious.append({**who, "cancelStatus": r.cancel_status})
        if r.cancel_gave_up:
            retry_refused.append({**who, "action": "cancel", "status": None})
        if r.terminate_status == 409 and r.terminate_state in IN_FLIGHT_STATES:
            refused_in_flight.append({**who, "refusedWhile": r.terminate_state})
        if r.terminate_gave_up:
            retry_refused.append({**who, "action": "terminate", "status": None})
        for a in r.operator_actions:
            if a["action"] not in ("retry", "cancel"):
                continue
            expected = a["expected"] if isinstance(a["expected"], (list, tuple)) else (a["expected"],)
            if a["status"] == 202 and a["result"] in expected:
                continue
            if a["status"] == 409 and a["answersLost"]:
                continue  # an earlier call whose answer was lost did it
            retry_refused.append({**who, **a})
        gen = int(view.get("generation") or 0)
        if status == 200 and not r.restarts_done <= gen <= r.restarts_done + r.restarts_unanswered + r.bulk_restarts:
            generation_wrong.append({**who, "generation": gen, "restartsAccepted": r.restarts_done,
                                     "restartAnswersLost": r.restarts_unanswered})
    counts = {
        "terminatesSent": sum(1 for r in accepted if r.terminate_status is not None or r.terminate_lost),
        "terminated": sum(1 for r in accepted
                          if r.terminate_status == 202 and r.terminate_result in TERMINATED_RESULTS),
        "terminateHeld": sum(1 for r in accepted if r.terminate_status == 202 and r.terminate_result == "held"),
        "terminateTooLate": sum(1 for r in accepted if r.terminate_status == 409),
        "restarted": sum(r.restarts_done for r in accepted),
        "compensationsRedriven": sum(r.redrives_done for r in accepted),
        "causesFixed": sum(1 for r in accepted if r.fixed),
        "heldRetried": sum(1 for r in accepted if r.held_retry_status == 202),
        "cancelled": sum(1 for r in accepted if r.cancel_status == 202),
    }
    return {"terminateWrong": terminate_wrong, "terminatedWithoutOperator": spurious,
            "terminateRefusedInFlight": refused_in_flight, "retryRefused": retry_refused,
            "generationWrong": generation_wrong, "counts": counts}


# ---- printing -------------------------------------------------------------------------------------


def limits_section(o: ChaosOptions, recs: list[OrderRec], stats: dict[str, Any],
                   app: dict[str, int]) -> dict[str, Any]:
    """The rate-limited remotes (--rate-limits) and the bursting customer (--burst-orders,
    --customer-max-in-flight): what they held back. The orders they held are checked as every
    order is (none lost, doubled or stuck: the waits ended)."""
    requests_of = stats.get("requests", {})
    rates = {}
    for remote, rate in o.rates().items():
        statuses = Counter[str]()
        for by_status in requests_of.get(remote, {}).values():
            statuses.update(by_status)
        rates[remote] = {"perSecond": rate, "calls": sum(statuses.values()), "answered429": statuses["429"]}
    burst = [r for r in recs if r.burst]
    return {"rateLimited": rates, "waitingReplies": app.get("agent.waiting", 0),
            "burstOrders": len(burst), "burstEnded": sum(1 for r in burst if is_terminal(r.view)),
            "customerMaxInFlight": o.customer_max_in_flight or None,
            "ordersWaitedForRoom": app.get("order.waiting_room", 0), "admitted": app.get("order.admitted", 0)}


def render_limits(limits: dict[str, Any]) -> list[str]:
    if not limits.get("rateLimited") and not limits.get("burstOrders"):
        return []
    rates = "; ".join(f"{name} at {r['perSecond']:g}/s: {r['answered429']} of {r['calls']} calls answered 429"
                      for name, r in limits["rateLimited"].items()) or "no rate limit"
    return [f"  limits: {rates}; waiting replies (a rate's or a breaker's) {limits['waitingReplies']}; "
            f"a burst of {limits['burstOrders']} orders of one customer ({limits['burstEnded']} ended), "
            f"CustomerMaxInFlight {limits['customerMaxInFlight'] or 'none'}: {limits['ordersWaitedForRoom']} "
            f"waited for room, {limits['admitted']} admitted"]


def render_summary(report: dict[str, Any]) -> str:
    c, f, orders = report["checks"], report["faults"], report["orders"]
    mark = lambda ok: "ok " if ok else "FAIL"  # noqa: E731
    inj = f.get("remoteInjected", {})
    tot: Counter[str] = Counter()
    for svc in SERVICES:
        tot.update({k: v for k, v in inj.get(svc, {}).items() if isinstance(v, int)})
    rej = f["permanentRejections"]
    sb = f.get("serviceBus") or {}
    lines = [
        "",
        f"chaos run: seed {report['seed']}, {orders['planned']} orders ({orders['accepted']} accepted; "
        f"workflows {orders.get('workflows', {})}), final states {orders['finalStates']}",
        *(f"  [{mark(x['ok'])}] {name}: {x['value']}" for name, x in c.items()),
        f"  compensations: {orders['failedWithEffectsToCompensate']} failed orders with effects, "
        f"{orders['compensationsApplied']}/{orders['compensationsNeeded']} applied; "
        f"{orders.get('compensationsOfNothing', 0)} of a timed-out step found nothing to undo",
    ]
    lines += [
        f"  held for an operator (an unknown outcome of a step that cannot be compensated): retried by the runner "
        f"as the operator {orders.get('operatorRetried', 0)}, still held {orders.get('heldForAnOperator', 0)}",
        _operator_line(orders.get("operator") or {}),
        *render_approvals(report.get("approvals") or {}, (report.get("approvals") or {}).get("timeoutSeconds")),
        *render_express(report.get("express") or {}),
        *render_bulk(report.get("bulk") or {}),
        *render_limits(report.get("limits") or {}),
        "  faults injected:",
        f"    host instance SIGKILLs {f['hostInstanceKills']}, Service Bus emulator restarts "
        f"{f['serviceBusEmulatorRestarts']}, Azurite restarts {f['azuriteRestarts']}, "
        f"shipping outage windows {f['shippingOutageWindows']}",
        f"    duplicate submissions {f['duplicateSubmissions']}, duplicate Service Bus deliveries "
        f"{f['duplicateDeliveries']} (requests {f['duplicateRequestDeliveries']}, replies "
        f"{f['duplicateReplyDeliveries']})",
        (f"    Service Bus (emulator counters): redeliveries {sb['redeliveries']} (lock expired {sb['lockExpired']}, "
         f"abandoned {sb['abandoned']}, released {sb['released']}), duplicates dropped {sb['duplicatesDropped']}, "
         f"dead-lettered {sb['deadLettered']}" if sb.get("available") else
         "    Service Bus emulator counters: not available"),
        f"    remote calls {sum(f['remoteCalls'].values())}: transient 503 {tot['transient']}, hangs {tot['hang']}, "
        f"lost responses {tot['lostResponse']}, outage {tot['down'] + tot['reset']}"
        + f"; all 503s {sum(f['remote503'].values())}",
        f"    permanent rejections: {rej['ordersDesigned']} orders (422 answers: reserve {rej['reserve422']}, "
        f"charge {rej['charge422']})",
        "  the app recognised: " + ", ".join(
            f"{k} {report.get('appObserved', {}).get(k, 0)}"
            for k in ("reply.duplicate", "reply.stale", "state.lost_race", "order.replayed", "supervisor.redrive",
                      "agent.expired", "schedule.resumed", "supervisor.unclaimed_rescheduled")),
        *(render_outage(report["outage"]) if "outage" in report else []),
        f"  durations: {report.get('durations', {})}",
        f"  replay: {report['replay']}",
        f"RESULT: {'PASS' if report['ok'] else 'FAIL'}",
    ]
    return "\n".join(lines)


def _operator_line(op: dict[str, Any]) -> str:
    g = lambda k: op.get(k, 0)  # noqa: E731
    return (f"  operator: terminated {g('terminated')} (held {g('terminateHeld')}, too late {g('terminateTooLate')}"
            f", of {g('terminatesSent')} sent); restarted {g('restarted')} ({g('restartedOrders')} orders up to "
            f"generation {g('highestGeneration')}: {g('restartedThenProcessed')} then Processed, "
            f"{g('restartedAndFailedAgain')} failed again; {g('earlierGenerationsUndone')} earlier generations undone, "
            f"{g('earlierGenerationsWithEffectsUndone')} of them with effects); compensations redriven "
            f"{g('compensationsRedriven')}; causes fixed {g('causesFixed')}; held orders retried {g('heldRetried')}"
            f"; cancelled {g('cancelled')}")


def run_chaos(opts: ChaosOptions, out: TextIO = sys.stdout) -> dict[str, Any]:
    """Run, print the summary, write the JSON report (if ``opts.out``); return the report."""
    runner = ChaosRun(opts, out=out)
    report = runner.run()
    out.write(render_summary(report) + "\n")
    out.flush()
    if runner.o.out:
        path = Path(runner.o.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
        out.write(f"report written to {path}\n")
    return report


class _Signal(Exception):
    pass


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=".venv/bin/python -m bench.chaos", description=__doc__.split("\n\n")[0])
    hints = get_type_hints(ChaosOptions)
    for f in fields(ChaosOptions)[:-2]:  # (progress_every, post_retry_seconds: none)
        help_, flag = f.metadata.get("help"), "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):  # --no-servicebus-restart -> restart_servicebus=False ...
            ap.add_argument(_NO_FLAGS.get(f.name, flag), dest=f.name, action="store_false" if f.default
                            else "store_true", help=help_)
            continue
        kind = next(t for t in get_args(hints[f.name]) or [hints[f.name]] if t is not type(None))
        ap.add_argument(flag, type=(lambda v: Path(v) if v else None) if kind is Path else kind, default=f.default,
                        help=help_)
    opts = ChaosOptions(**vars(ap.parse_args(list(argv) if argv is not None else None)))
    if opts.instances < 2:
        ap.error("--instances must be at least 2")

    def on_signal(signum: int, frame: object) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the clean-up short
        raise _Signal(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        report = run_chaos(opts)
    except (KeyboardInterrupt, _Signal, _Aborted) as e:
        print(f"interrupted ({e or 'SIGINT'}); the stack was stopped", file=sys.stderr)
        return 130
    except Exception as e:  # the stack did not start, a component could not be restarted ...
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
