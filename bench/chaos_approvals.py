"""The chaos run's approvals (issue 29): orders whose workflow waits for an event get it from the
runner on time, early, late, twice, declined, or never.

Under order v2 an order over 1000 waits for ``approval`` before it is charged. ``approval_share``
of the orders get an item that puts them over it, and a plan from
``random.Random(f"{seed}:approvals")``: ``onTime`` (sent once it is seen waiting: ``step-done``),
``early`` (right after the 202: ``event-kept``; the order's reservation hangs on a SKU of its own
until the answer, so the event comes first), ``late`` (3-10 s after it was seen waiting),
``twice`` (the same event again, by key or by body, in turn or at once: one ``step-done``, one
``event-duplicate``; then a different one: 409), ``declined`` (``compensating``) and ``never`` (the
wait times out; an event after the end: 409; among the first 60% of the orders). The orders that
wait for a designed cause are approved (a restarted order waits again in each generation).

A day's wait would not end within a run: the stack runs on the run's own copy of ``workflows/``
(``write_workflows``: every wait's ``timeoutSeconds`` set to ``approval_timeout``), checked through
``GET /api/workflows``. The checks (``approval_outcomes``): every order planned to wait waits, and
no other; each answer is the expected one; no generation ends its wait twice; an approved order is
not failed at its wait; a declined or timed-out one ends Error there, never charged, undone.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import requests
import yaml

from bench.chaos_ledger import generations, split_ledger, view_effects
from bench.chaos_records import (
    AT_ONCE,
    DUPLICATE,
    KEPT,
    REFUSED,
    Actor,
    ApprovalPlan,
    ChaosRunner,
    EventSend,
    OrderRec,
    is_terminal,
    post_until_answered,
    problem_of,
)
from local.host.keys import FUNCTION
from shared.core.workflows import AGENTS_BY_NAME, Step, Workflow, load_directory, load_registry, workflows_directory

KINDS = ("onTime", "early", "late", "twice", "declined", "never")
APPROVING = ("onTime", "early", "late", "twice")
RESTARTABLE_KINDS = ("onTime", "early", "late")  # for orders the operator restarts (no copy may reach a later one)
APPROVAL_SKU = "SKU-APPROVE"
APPROVAL_UNIT_PRICE = 1500  # over the approval threshold (1000), under the payment limit (50000)
NEVER_WITHIN = 0.6  # never-approved orders are among this share of the first orders
LATE_SECONDS = (3.0, 10.0)
HOLD_SKU = "SKU-HOLD-{index}"  # an early order's: the inventory service hangs on it until the event is answered


# ---- the run's workflows ----------------------------------------------------------------------


def write_workflows(dest: Path, wait_timeout: int, source: Path | None = None) -> dict[str, int]:
    """Copies of ``source``'s workflows (default: the app's) in ``dest``, every wait step's
    ``timeoutSeconds`` set to ``wait_timeout``; loaded with the app's loader, so a copy the app
    would refuse fails here. -> ``{"order v2/approval": timeout}`` for each wait step."""
    source = source or workflows_directory()
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.y*ml"):
        old.unlink()
    for path in sorted(p for p in source.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for step in doc.get("steps") or []:
            if isinstance(step, dict) and step.get("kind") == "wait":
                step["timeoutSeconds"] = int(wait_timeout)
        (dest / path.name).write_text(
            f"# {path.name} for a chaos run: every wait step's timeoutSeconds is {wait_timeout} "
            "(bench.chaos_approvals)\n" + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    registry = load_directory(dest, AGENTS_BY_NAME)
    return {f"{wf.label}/{s.name}": s.timeout_seconds for wf in registry.all() for s in wf.steps if s.kind == "wait"}


def served_wait_timeouts(workflows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The wait steps' timeouts as ``GET /api/workflows`` shows them (``{"order v2/approval": s}``)."""
    return {f"{wf.get('name')} v{wf.get('version')}/{s.get('name')}": s.get("timeoutSeconds")
            for wf in workflows for s in wf.get("steps") or [] if s.get("kind") == "wait"}


def order_facts(body: Mapping[str, Any]) -> dict[str, Any]:
    """An order's fields as a step's ``when`` reads them (its total a decimal string)."""
    items = body.get("items") or []
    total = sum((Decimal(str(i["quantity"])) * Decimal(str(i["unitPrice"])) for i in items), Decimal(0))
    return {"customerId": body.get("customerId"), "currency": body.get("currency"), "total": str(total),
            "items": items, "priority": body.get("priority") or "normal"}


def wait_step(workflow: Workflow, body: Mapping[str, Any]) -> Step | None:
    """The first wait step of ``workflow`` that runs for the order ``body`` (None: it waits for nothing)."""
    facts = order_facts(body)
    return next((s for s in workflow.steps if s.kind == "wait" and s.runs_for(facts)), None)


# ---- plans and what was sent ------------------------------------------------------------------


def _event_body(plan: ApprovalPlan, approved: bool, **extra: Any) -> dict[str, Any]:
    return {plan.decision or "approved": approved, "by": "chaos", "plan": plan.kind, **extra}


def _key(rec: OrderRec, plan: ApprovalPlan, generation: int, suffix: str = "") -> str:
    return f"{rec.key}:{plan.event}:g{generation}{suffix}"


class Approvals(Actor):
    """Plans the approvals and sends them from a thread of its own (``loop``), and from the
    submission's thread for the early ones (``accepted``)."""

    name = "approval"

    def __init__(self, run: ChaosRunner) -> None:
        super().__init__(run)
        self.rng = random.Random(f"{run.o.seed}:approvals")
        self.lock = threading.Lock()
        self.timeouts: dict[str, int] = {}  # the wait steps' timeouts the stack serves

    # ---- plan ---------------------------------------------------------------------------------

    def plan(self) -> None:
        """After ``plan_orders`` and the operator's plan: every order that waits already (a
        designed cause over the threshold) gets an approving plan, then the approval-share
        orders are made to wait (an item over the threshold) and get the kinds in turn. The
        designed orders' plans come first: they do not change with the share."""
        o, rng, recs = self.run.o, self.rng, self.run.recs
        registry = load_registry()
        waits = {r.index: wait_step(registry.latest(r.workflow), r.body) for r in recs}
        for r in recs:
            spec = waits[r.index]
            if spec is not None:  # restarted by the operator: no copy of an event may reach its next generation
                self._assign(r, spec, rng.choice(RESTARTABLE_KINDS if r.restarts_planned else APPROVING),
                             designed=True)
        free = [r for r in recs if waits[r.index] is None and r.reject is None and r.fix is None
                and r.terminate_after is None
                and wait_step(registry.latest(r.workflow), _with_item(r.body)) is not None]
        n = min(len(free), round(o.orders * o.approval_share))
        chosen = sorted(rng.sample(free, n), key=lambda r: r.index)
        kinds = [KINDS[i % len(KINDS)] for i in range(n)]
        early = [r for r in chosen if r.index < NEVER_WITHIN * o.orders]
        nevers = set(id(r) for r in rng.sample(early, min(len(early), kinds.count("never"))))
        others = [k for k in kinds if k != "never"] + ["onTime"] * (kinds.count("never") - len(nevers))
        rng.shuffle(others)
        it = iter(others)
        for r in chosen:
            r.body["items"].append({"sku": APPROVAL_SKU, "quantity": 1, "unitPrice": APPROVAL_UNIT_PRICE})
            self._assign(r, wait_step(registry.latest(r.workflow), r.body), "never" if id(r) in nevers else next(it))

    def _assign(self, rec: OrderRec, spec: Step | None, kind: str, designed: bool = False) -> None:
        assert spec is not None and spec.event is not None, rec.index
        lo, hi = LATE_SECONDS
        hi = max(lo, min(hi, 0.4 * self.run.o.approval_timeout))
        rec.approval = ApprovalPlan(kind=kind, step=spec.name, event=spec.event, decision=spec.decision,
                                    designed=designed, late_seconds=round(self.rng.uniform(lo, hi), 2),
                                    twice_by=self.rng.choice(("key", "body")), concurrent=self.rng.random() < 0.5)
        if kind == "early":
            rec.approval.hold_sku = HOLD_SKU.format(index=rec.index)
            rec.body["items"].append({"sku": rec.approval.hold_sku, "quantity": 1, "unitPrice": 1})

    def held_skus(self) -> list[str]:
        """The SKUs the inventory service hangs on from the start (the early orders' holds)."""
        return [r.approval.hold_sku for r in self.run.recs if r.approval is not None and r.approval.hold_sku]

    def check_stack(self) -> None:
        """The wait timeouts the stack serves (``GET /api/workflows``) are the run's own."""
        run = self.run
        assert run.stack is not None
        try:
            r = run.session(FUNCTION).get(f"{run.stack.api_url}/workflows", timeout=30)
            self.timeouts = served_wait_timeouts((r.json() or {}).get("workflows") or [])
        except (requests.RequestException, ValueError) as e:
            run.errors.append(f"GET /api/workflows: {type(e).__name__}: {e}")
            return
        wrong = {k: v for k, v in self.timeouts.items() if v != run.o.approval_timeout}
        if wrong or not self.timeouts:
            run.errors.append(f"the stack's wait steps do not wait {run.o.approval_timeout} s: {self.timeouts}")

    # ---- what is due --------------------------------------------------------------------------

    @staticmethod
    def _generation(rec: OrderRec) -> int:
        return int((rec.view or {}).get("generation") or 0)

    @staticmethod
    def _awaiting(rec: OrderRec, plan: ApprovalPlan) -> bool:
        aw = (rec.view or {}).get("awaiting") or {}
        return aw.get("step") == plan.step and aw.get("kind") == "event"

    def watching(self, rec: OrderRec) -> bool:
        """Whether the order is polled closely (every 0.5 s): its current generation's event is
        still to be sent."""
        plan = rec.approval
        if plan is None:
            return False
        g = self._generation(rec)
        return g not in plan.handled and not (plan.kind == "never" and g == 0)

    def due(self, rec: OrderRec, now: float) -> str | None:
        """The send the order is owed now, if any (``now``: inf asks whether one is still owed)."""
        plan = rec.approval
        if plan is None or not rec.order_id:
            return None
        g = self._generation(rec)
        if plan.kind == "early" and not plan.sent("early"):
            return "early"
        if plan.kind == "twice" and plan.sent("approve"):
            if not plan.sent("copy"):
                return "copy"
            return None if plan.sent("different") else "different"
        if plan.kind == "never" and g == 0:
            return "tooLate" if is_terminal(rec.view) and not plan.sent("tooLate") else None
        if g in plan.handled or not self._awaiting(rec, plan):
            return None
        if g == 0 and plan.kind == "late" and now < plan.seen.get(g, now) + plan.late_seconds:
            return None
        return "decline" if g == 0 and plan.kind == "declined" else "approve"

    def notice(self, rec: OrderRec, now: float) -> None:
        """An order seen waiting: note when (a late send counts from then); one waiting with no
        plan gets one (on time) so that the run ends, and a check counts it."""
        if rec.view is None or not (rec.view.get("awaiting") or {}).get("kind") == "event":
            return
        if rec.approval is None:
            aw = rec.view["awaiting"]
            rec.approval = ApprovalPlan(kind="onTime", step=aw.get("step"), event=aw.get("event"),
                                        decision=aw.get("decision"), unplanned=True)
        if self._awaiting(rec, rec.approval):
            rec.approval.seen.setdefault(self._generation(rec), now)

    # ---- acting -------------------------------------------------------------------------------

    def accepted(self, rec: OrderRec) -> None:
        """Called by the submission right after the POST's 202: an early event goes now."""
        with self.run.lock:
            plan = rec.approval
            if (plan is None or plan.kind != "early" or rec.index in self.busy
                    or self.due(rec, time.monotonic()) != "early"):
                return
            self.busy.add(rec.index)
        self.take(rec, "early")

    def act(self, rec: OrderRec, action: str) -> None:
        plan = rec.approval
        assert plan is not None
        g = self._generation(rec)
        if action == "early":
            try:
                self._send(rec, EventSend("early", 0, _key(rec, plan, 0), _event_body(plan, True)))
            finally:
                if plan.hold_sku:  # the reservation's next attempt goes through
                    self.run.remove_remote_cause("hold", plan.hold_sku)
            plan.handled.add(0)
        elif action == "approve" and plan.kind == "twice" and g == 0:
            self._approve_twice(rec, plan)
            plan.handled.add(0)
        elif action in ("approve", "decline"):
            key = None if plan.kind == "twice" and plan.twice_by == "body" else _key(rec, plan, g)
            self._send(rec, EventSend(action, g, key, _event_body(plan, action == "approve")))
            plan.handled.add(g)
        elif action == "copy":
            first = next(s for s in plan.sends if s.what == "approve")
            self._send(rec, EventSend("copy", first.generation, first.key, dict(first.body)))
        elif action == "different":
            first = next(s for s in plan.sends if s.what == "approve")
            key = None if first.key is None else _key(rec, plan, first.generation, ":changed")
            self._send(rec, EventSend("different", first.generation, key,
                                      _event_body(plan, False, note="a different second event")))
        elif action == "tooLate":
            self._send(rec, EventSend("tooLate", 0, _key(rec, plan, 0), _event_body(plan, True, note="too late")))

    def _approve_twice(self, rec: OrderRec, plan: ApprovalPlan) -> None:
        """The event and its copy: one after the other (the copy is sent by ``due`` next), or both at once."""
        key = _key(rec, plan, 0) if plan.twice_by == "key" else None
        first = EventSend("approve", 0, key, _event_body(plan, True))
        if not plan.concurrent:
            self._send(rec, first)
            return
        copy = EventSend("copy", 0, key, dict(first.body))
        with self.lock:
            first.pair, copy.pair = len(plan.sends) + 1, len(plan.sends)
            plan.sends += [first, copy]
        other = threading.Thread(target=self._send, args=(rec, copy, False), name="approval-copy", daemon=True)
        other.start()
        self._send(rec, first, record=False)
        other.join()

    def _send(self, rec: OrderRec, send: EventSend, record: bool = True) -> None:
        """POST the event, retrying what is not an answer (a killed instance, a restart, a 409
        "the order kept changing"); record it (unless it is already) and its answer on the
        order's plan."""
        run = self.run
        assert run.stack is not None and rec.approval is not None
        if record:
            with self.lock:
                rec.approval.sends.append(send)
        send.t = round(run.elapsed(), 2)
        url = f"{run.stack.api_url}/orders/{rec.order_id}/events/{rec.approval.event}"  # an operator route
        status, answer, send.lost = post_until_answered(
            run, url, json=send.body, headers={"Idempotency-Key": send.key} if send.key else {})
        if status is not None:
            send.status, send.problem = status, problem_of(answer) if status != 202 else None
            send.result = answer.get("result") if status == 202 else str(status)
        with run.lock:
            run.faults["approvalEventsSent"] += 1
        run.event("approval-event", orderId=rec.order_id, what=send.what, generation=send.generation,
                  status=send.status, result=send.result, lost=send.lost)


def _with_item(body: Mapping[str, Any]) -> dict[str, Any]:
    return {**body, "items": [*body.get("items", []),
                              {"sku": APPROVAL_SKU, "quantity": 1, "unitPrice": APPROVAL_UNIT_PRICE}]}


# ---- the checks -------------------------------------------------------------------------------


def answer_ok(send: EventSend | Mapping[str, Any]) -> bool:
    """Whether a send got an answer its kind expects. An event whose earlier call lost its
    answer may find its own event there: ``event-duplicate`` is then an answer too."""
    s = send.to_json() if isinstance(send, EventSend) else send
    expected = set(s["expected"])
    if REFUSED in expected:
        return s["status"] == 409 and s.get("problem") == "wrong-state"
    if s["lost"]:
        expected.add(DUPLICATE)
    return s["status"] == 202 and s["result"] in expected


def _count(events: Iterable[Mapping[str, Any]], step: str) -> Counter[str]:
    return Counter(str(ev.get("event")) for ev in events if ev.get("step") == step)


def approval_outcomes(recs: list[OrderRec], views: Mapping[str, tuple[int | None, dict[str, Any] | None]],
                      ledger: list[dict[str, Any]],
                      histories: Mapping[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The approvals' checks and figures (module docstring), from the orders' final views (their
    histories, if given, else each view's first page) and the simulator's ledger."""
    steps_of = {oid: view_effects(v if s == 200 else None) for oid, (s, v) in views.items()}
    per_order, _ = split_ledger(ledger, steps_of)
    mismatch, answers_wrong, twice, approved_not_processed, charged, not_undone = [], [], [], [], [], []
    # the approval-share orders' plans and outcomes, and apart those that wait for a designed cause
    plans: dict[bool, Counter[str]] = {False: Counter(), True: Counter()}
    outcomes: dict[bool, dict[str, Counter[str]]] = {d: {k: Counter() for k in KINDS} for d in (False, True)}
    answers: Counter[str] = Counter()
    early_kept = timed_out = different_refused = too_late_refused = later_generations = lost = 0
    for r in recs:
        if not r.order_id:
            continue
        status, final = views.get(r.order_id, (None, None))
        view = final if status == 200 and final else (r.view or {})
        plan = r.approval
        steps = view.get("steps") or []
        waits = [s for s in steps if s.get("kind") == "wait"]
        waited = [s for s in waits if s.get("state") != "Skipped"]
        who = {"orderId": r.order_id, "processState": view.get("processState"), "outcome": view.get("outcome"),
               "failedStep": view.get("failedStep"), "plan": plan.kind if plan else None}
        if status != 200 or not final:
            if plan is not None:
                plans[plan.designed][plan.kind] += 1
            continue  # lost: another check says so
        if plan is None or plan.unplanned:
            if waited or (plan is not None and plan.unplanned):
                mismatch.append({**who, "problem": "waited for an event with no plan",
                                 "waits": [s.get("name") for s in waited]})
            continue
        plans[plan.designed][plan.kind] += 1
        spec = next((s for s in steps if s.get("name") == plan.step), None)
        if spec is None or spec.get("kind") != "wait" or spec.get("state") == "Skipped":
            mismatch.append({**who, "problem": f"planned to wait at {plan.step!r}, which it "
                             + ("skipped" if spec else "does not have")})
            continue
        state, outcome, failed_step = view.get("processState"), view.get("outcome"), view.get("failedStep")
        names = [s.get("name") for s in steps]
        at = names.index(plan.step)
        # failed for good at a step before its wait (another fault): the wait never started
        before_wait = state == "Error" and failed_step in names and names.index(failed_step) < at
        label = "failedBeforeItsWait" if before_wait else str(outcome or state)
        outcomes[plan.designed][plan.kind][label] += 1

        # each answer as expected
        for i, s in enumerate(plan.sends):
            answers[s.result or "none"] += 1
            lost += s.lost
            if not answer_ok(s):
                answers_wrong.append({**who, "send": s.to_json()})
            if s.pair is not None and s.pair > i:
                pair = sorted(x.result or "none" for x in (s, plan.sends[s.pair]))
                if pair != sorted(AT_ONCE) and not (s.lost or plan.sends[s.pair].lost):
                    answers_wrong.append({**who, "sendsAtOnce": pair, "expected": sorted(AT_ONCE)})
            early_kept += s.what == "early" and s.result == KEPT
            different_refused += s.what == "different" and answer_ok(s)
            too_late_refused += s.what == "tooLate" and answer_ok(s)
            later_generations += s.generation > 0 and s.what == "approve"

        # one event and one end of the wait per generation
        history = (histories or {}).get(r.order_id)
        gens = generations(history if history is not None else view.get("history") or [])
        for g, events in enumerate(gens):
            c = _count(events, plan.step)
            ends = c["stepDone"] + c["stepFailed"]
            if c["eventReceived"] > 1 or c["stepDone"] > 1 or ends > 1 or c["waitTimedOut"] > 1:
                twice.append({**who, "generation": g, "eventReceived": c["eventReceived"], "stepDone": c["stepDone"],
                              "stepFailed": c["stepFailed"], "waitTimedOut": c["waitTimedOut"]})
        last = _count(gens[-1], plan.step)
        timed_out += last["waitTimedOut"]

        if plan.kind in APPROVING:
            # failed at its wait (or after it with the wait not done), or processed without its event
            bad = ((state == "Error" and (failed_step is None or failed_step not in names
                                          or names.index(failed_step) >= at and spec.get("state") != "Done"
                                          or failed_step == plan.step))
                   or (state == "Processed" and (spec.get("state") != "Done" or not last["eventReceived"]))
                   or last["waitTimedOut"])
            if bad:
                approved_not_processed.append({**who, "waitStep": spec.get("state"), "history": dict(last)})
            continue

        # declined or never: Error at the wait, the steps before undone, none after applied
        effects = per_order[r.order_id].effects[int(view.get("generation") or 0)]
        effect_steps = steps_of.get(r.order_id) or {}
        applied_after, kept = {}, {}
        for n in names:
            if n not in effect_steps:
                continue  # a wait, a delay: no effect
            svc, forward, comp = effect_steps[n]
            done = effects.get((svc, forward), 0)
            if names.index(n) > at and done:
                applied_after[n] = done
            elif names.index(n) < at and comp is not None and done != effects.get((svc, comp), 0):
                kept[n] = {"applied": done, "compensated": effects.get((svc, comp), 0)}
        if applied_after:
            charged.append({**who, "applied": applied_after})
        if before_wait:
            continue  # compensated as any failed order (the ledger's checks)
        expect_event = 1 if plan.kind == "declined" else 0
        wrong = []
        if not (state == "Error" and outcome == "failed" and failed_step == plan.step):
            wrong.append("not Error/failed at its wait")
        if spec.get("state") != "Failed":
            wrong.append(f"its wait is {spec.get('state')}")
        if (view.get("compensation") or {}).get("state") not in ("completed", "none"):
            wrong.append(f"compensation {(view.get('compensation') or {}).get('state')}")
        if kept:
            wrong.append(f"not undone: {kept}")
        if last["eventReceived"] != expect_event or last["waitTimedOut"] != 1 - expect_event or last["stepDone"]:
            wrong.append(f"history {dict(last)}")
        if wrong:
            not_undone.append({**who, "problems": wrong})
    summary = {
        "orders": sum(plans[False].values()) + sum(plans[True].values()),
        "plans": {k: plans[False][k] for k in KINDS},
        "outcomes": {k: dict(v) for k, v in outcomes[False].items() if v},
        # the designed rejections and the operator's limit orders, over the threshold too: approved
        "designed": {"orders": sum(plans[True].values()), "plans": {k: n for k, n in plans[True].items() if n},
                     "outcomes": {k: dict(v) for k, v in outcomes[True].items() if v}},
        "eventsSent": sum(answers.values()), "answers": dict(sorted(answers.items())), "answersLost": lost,
        "earlyKept": early_kept, "timedOut": timed_out, "differentSecondEventsRefused": different_refused,
        "tooLateRefused": too_late_refused, "laterGenerationsApproved": later_generations,
    }
    return {"planMismatch": mismatch, "answersWrong": answers_wrong, "stepRunTwice": twice,
            "approvedNotProcessed": approved_not_processed, "refusedCharged": charged, "refusedNotUndone": not_undone,
            "summary": summary}


def render_approvals(summary: Mapping[str, Any], timeouts: Mapping[str, int] | None = None) -> list[str]:
    """The approvals' lines of the printed summary."""
    if not summary or not summary.get("orders"):
        return ["  approvals: none"]
    def per_kind(plans: Mapping[str, int], outs: Mapping[str, Mapping[str, int]]) -> str:
        return ", ".join(f"{k} {plans.get(k, 0)}" + (f" ({', '.join(f'{o} {n}' for o, n in outs[k].items())})"
                                                    if outs.get(k) else "") for k in KINDS if k in plans)

    designed = summary.get("designed") or {}
    wait = ", ".join(f"{k} {v} s" for k, v in (timeouts or {}).items()) or "?"
    return [
        f"  approvals ({wait}): {summary['orders']} orders waited: "
        f"{per_kind(summary.get('plans') or {}, summary.get('outcomes') or {})}; for a designed cause "
        f"{designed.get('orders', 0)}: {per_kind(designed.get('plans') or {}, designed.get('outcomes') or {})}",
        f"    events sent {summary.get('eventsSent', 0)}: answers {summary.get('answers', {})}, answers lost "
        f"{summary.get('answersLost', 0)}; early kept {summary.get('earlyKept', 0)}, timed out "
        f"{summary.get('timedOut', 0)}, different second events refused "
        f"{summary.get('differentSecondEventsRefused', 0)}, too late refused {summary.get('tooLateRefused', 0)}, "
        f"later generations approved {summary.get('laterGenerationsApproved', 0)}",
    ]
