"""The chaos run's express orders (issue 29): a parallel step amid the faults.

``workflows/express.v1.yaml`` reserves and charges at once (the parallel step ``prepare``), then
ships (the pivot). ``express_share`` of the orders (drawn from ``random.Random(f"{seed}:express")``
among those not digital) go through every fault of the run, and the plan makes sure of the paths a
parallel step adds:

* **designed rejections**: at least one express order of each kind (the reservation branch refused
  while the charge runs or is done, or the charge refused while the reservation runs or is done);
  the operator restarts them, so each generation must be undone again, by key;
* ``groupTerminate``: terminated while its group runs (its reservation hangs on a SKU of its own
  until just before the terminate): the stopped reservation compensated by its key (a tombstone),
  the charge refunded;
* ``pivotCancel``: terminated at its shipment, which hangs (held: the outcome is unknown), then
  cancelled by the operator, who knows nothing shipped: both branches undone in reverse order of
  completion. Posted clear of the shipping outage, so that their holds stay out of its report.

The checks (``express_outcomes``; each 0 for a PASS): ``expressOrdersNotRunAsExpress``,
``expressCompensationsOutOfOrder`` (both branches undone, not in reverse order of their rows'
``finishedAt``; ties may go either way), ``expressFailedOrdersWithBranchEffectsStanding`` and
``expressBranchesNotCompensatedByKey`` (a stopped or done branch of a failed order whose
compensation is not Done, or not in the ledger exactly once: a release or refund if it was applied,
a tombstone if not).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from bench.chaos_ledger import generations as history_generations
from bench.chaos_ledger import parse_time, split_ledger, view_effects
from bench.chaos_records import is_held, is_terminal
from shared.core.statemachine.groups import STOPPED_REASON
from shared.core.states import TERMINATED_REASON
from shared.core.workflows import Workflow, load_registry

if TYPE_CHECKING:
    from bench.chaos_records import ChaosRunner, OrderRec

EXPRESS_WORKFLOW = "express"
GROUP_HOLD_SKU = "SKU-GROUP-{index}"  # the inventory service hangs on it until the operator terminates the order
PIVOT_HOLD_SKU = "SKU-PIVOT-{index}"  # the shipping service hangs on it for the whole run
GROUP_TERMINATE_AFTER = (2.5, 3.5)  # seconds after the 202: the reservation hangs (its deadline: 4 s), the group runs
OUTAGE_MARGIN = (3.0, 2.0)  # a pivotCancel order is not posted this long before or after the shipping outage
PLANS = ("groupTerminate", "pivotCancel")
REJECTED_BRANCH = {"amount": ("payment", "charge"), "sku": ("inventory", "reserve"),
                   "limit": ("payment", "charge"), "restock": ("inventory", "reserve")}


# ---- the plan ---------------------------------------------------------------------------------


def plan_express(orders: int, share: float, seed: int | None, taken: Iterable[int] = ()) -> set[int]:
    """The orders that run express: ``round(orders * share)`` of those not ``taken`` (the digital
    ones), drawn from a generator of their own (the rest of a seed's plan does not change)."""
    free = sorted(set(range(orders)) - set(taken))
    n = min(len(free), round(orders * share))
    return set(random.Random(f"{seed}:express").sample(free, n)) if n else set()


def express_rejections(express: list[tuple[int, str | None]], reject_rate: float, seed: int | None) -> dict[int, str]:
    """The express orders (``(index, designed rejection or None)``) to make designed rejections,
    so that each kind (``amount``, ``sku``) has at least ``max(1, round(n * reject_rate / 2))``
    express orders; none if ``reject_rate`` is 0. -> {index: kind}."""
    if reject_rate <= 0 or not express:
        return {}
    rng = random.Random(f"{seed}:express-rejections")
    want = max(1, round(len(express) * reject_rate / 2))
    have = Counter(kind for _, kind in express if kind)
    free = [i for i, kind in express if kind is None]
    out: dict[int, str] = {}
    for kind in ("amount", "sku"):
        for i in rng.sample(free, min(len(free), max(0, want - have[kind]))):
            out[i] = kind
            free.remove(i)
    return out


def at_pivot(view: Mapping[str, Any] | None) -> bool:
    """The order runs its pivot step (the shipment): in flight, its current step a call with no group
    after the group."""
    if not view or view.get("processState") not in ("Pending", "Processing"):
        return False
    steps = view.get("steps") or []
    names = [s.get("name") for s in steps]
    current = view.get("currentStep")
    if current not in names:
        return False  # the group (its name is no step's) or nothing
    at = names.index(current)
    return any(s.get("group") for s in steps[:at])


class Express:
    """Plans the express orders' designed paths (module docstring); the operator takes the actions."""

    def __init__(self, run: ChaosRunner) -> None:
        self.run = run
        self.rng = random.Random(f"{run.o.seed}:express")

    def plan(self, events: Iterable[tuple[float, str]] = ()) -> None:
        """After the operator's plan: ``groupTerminate`` and ``pivotCancel`` express orders,
        ``max(1, round(n * terminate_rate))`` each (none if the operator terminates nothing),
        among the express orders the operator does nothing else to. ``events``: the run's fault
        plan (``plan_events``), for the shipping outage's window."""
        o, rng = self.run.o, self.rng
        express = [r for r in self.run.recs if r.workflow == EXPRESS_WORKFLOW]
        if not express or o.terminate_rate <= 0:
            return
        n = max(1, round(len(express) * o.terminate_rate))
        free = [r for r in express if r.reject is None and r.fix is None and r.terminate_after is None
                and r.approval is None]
        starts = [at for at, kind in events if kind == "outage-start"]
        ends = [at for at, kind in events if kind == "outage-end"]
        before, after = OUTAGE_MARGIN

        def clear_of_outage(r: OrderRec) -> bool:
            due = r.index / o.rate
            return not any(s - before <= due <= e + after for s, e in zip(starts, ends, strict=False))

        pivot = sorted(rng.sample([r for r in free if clear_of_outage(r)],
                                  min(n, sum(1 for r in free if clear_of_outage(r)))), key=lambda r: r.index)
        rest = [r for r in free if r not in pivot]
        group = sorted(rng.sample(rest, min(n, len(rest))), key=lambda r: r.index)
        for r in group:
            r.dup_delivery = True
            r.express_plan, r.express_hold_sku = "groupTerminate", GROUP_HOLD_SKU.format(index=r.index)
            r.terminate_after = round(rng.uniform(*GROUP_TERMINATE_AFTER), 3)
            r.body["items"].append({"sku": r.express_hold_sku, "quantity": 1, "unitPrice": 1})
        for r in pivot:
            r.dup_delivery = True
            r.express_plan, r.express_hold_sku = "pivotCancel", PIVOT_HOLD_SKU.format(index=r.index)
            r.body["items"].append({"sku": r.express_hold_sku, "quantity": 1, "unitPrice": 1})

    def held_skus(self, plan: str) -> list[str]:
        """The SKUs a remote hangs on from the start: the inventory's for ``groupTerminate``, the
        shipping service's for ``pivotCancel``."""
        return [r.express_hold_sku for r in self.run.recs if r.express_plan == plan and r.express_hold_sku]


# ---- the checks -------------------------------------------------------------------------------


def express_outcomes(recs: list[OrderRec], views: Mapping[str, tuple[int | None, dict[str, Any] | None]],
                     ledger: list[dict[str, Any]],
                     histories: Mapping[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The express checks and figures (module docstring), from the final views (and the whole
    histories, if given, else each view's first page) and the simulator's ledger."""
    registry = load_registry()
    express = [r for r in recs if r.workflow == EXPRESS_WORKFLOW and r.order_id]
    ids = {r.order_id for r in express if r.order_id}
    effects_of = {oid: view_effects(v if s == 200 else None) for oid, (s, v) in views.items() if oid in ids}
    per_order, _ = split_ledger(ledger, effects_of)
    not_express, out_of_order, standing, by_key = [], [], [], []
    outcomes: Counter[str] = Counter()
    failed_at: Counter[str] = Counter()
    reverse = Counter({"bothUndone": 0, "passed": 0, "ties": 0, "notComparable": 0})
    stopped = Counter({"byFailure": 0, "byTerminate": 0, "tombstones": 0, "undone": 0})
    rejections: dict[str, Counter[str]] = {}
    both_standing = restarted = generations = 0
    for r in express:
        oid = str(r.order_id)
        status, view = views.get(oid, (None, None))
        if status != 200 or not view:
            continue  # lost: another check says so
        named = view.get("workflow") or {}
        if named.get("name") != EXPRESS_WORKFLOW:
            not_express.append({"orderId": oid, "workflow": named})
            continue
        wf: Workflow = registry.get(EXPRESS_WORKFLOW, int(named.get("version") or 1))
        branches = [s.name for s in wf.steps if s.group]
        effects = effects_of[oid]
        fx = per_order[oid]
        state, outcome = view.get("processState"), view.get("outcome")
        settled = is_terminal(view)
        failed = settled and state == "Error" and not is_held(view)
        last = int(view.get("generation") or 0)
        outcomes[str(outcome or state)] += 1
        if state == "Error" and view.get("failedStep"):
            failed_at[str(view["failedStep"])] += 1
        restarted += last > 0
        generations += last + 1
        who = {"orderId": oid, "processState": state, "outcome": outcome, "failedStep": view.get("failedStep")}

        # no branch effect left standing on a failed generation
        for g in [*range(last), *([last] if failed else [])]:
            left = [b for b in branches if fx.applied(g, b) and fx.undone(g, b) != fx.applied(g, b)]
            if left:
                both_standing += len(left) == len(branches)
                standing.append({**who, "generation": g, "standing": left,
                                 "applied": {b: fx.applied(g, b) for b in branches},
                                 "undone": {b: fx.undone(g, b) for b in branches}})

        # the last generation's branches, as its rows show them, against the ledger
        rows = {s.get("name"): s for s in view.get("steps") or []}
        if failed:
            for b in branches:
                row = rows.get(b) or {}
                cstate = (row.get("compensation") or {}).get("state")
                applied, undone, tombs = fx.applied(last, b), fx.undone(last, b), fx.tombstoned(last, b)
                reason = str(row.get("failureReason") or "")
                fenced = row.get("state") == "Failed" and reason in (STOPPED_REASON, TERMINATED_REASON)
                if fenced:
                    stopped["byFailure" if reason == STOPPED_REASON else "byTerminate"] += 1
                    stopped["tombstones"] += tombs
                    stopped["undone"] += undone
                problem = None
                if (fenced or row.get("state") == "Done") and cstate != "Done":
                    problem = f"{row.get('state')} ({reason or 'done'}), its compensation {cstate}"
                elif cstate == "Done" and not fx.compensated_once(last, b):
                    problem = "compensation Done, not once by its key"
                elif cstate is None and (applied or undone or tombs):
                    problem = "no compensation, yet the ledger has its effect or compensation"
                if problem:
                    by_key.append({**who, "generation": last, "branch": b, "problem": problem,
                                   "state": row.get("state"), "compensation": cstate, "applied": applied,
                                   "undone": undone, "tombstones": tombs})

        # designed rejections: in each generation they held for, the refused branch applied
        # nothing and the other one was compensated exactly once by its key
        cause = r.reject or (r.fix if r.fix in ("limit", "restock") else None)
        if cause is not None:
            refused = next((b for b in branches if effects[b][:2] == REJECTED_BRANCH[cause]), None)
            ended = last if settled and state == "Error" else last - 1
            gens = range(min(ended, 0 if r.reject is None else ended) + 1)
            if refused is not None:
                tally = rejections.setdefault(refused, Counter({"orders": 0, "generations": 0, "otherUndone": 0,
                                                                "otherTombstoned": 0}))
                tally["orders"] += bool(gens)
                for g in gens:
                    tally["generations"] += 1
                    problems = [f"{refused} applied"] if fx.applied(g, refused) else []
                    for b in branches:
                        if b == refused:
                            continue
                        tally["otherUndone"] += fx.undone(g, b)
                        tally["otherTombstoned"] += fx.tombstoned(g, b)
                        if not fx.compensated_once(g, b):
                            problems.append(f"{b} not compensated once by its key")
                    if problems:
                        by_key.append({**who, "generation": g, "designed": cause, "problem": "; ".join(problems)})

        # both branches applied and undone: the compensations in reverse order of completion
        if not failed or not branches or not all(fx.applied(last, b) == 1 and fx.undone(last, b) == 1
                                                 for b in branches):
            continue
        reverse["bothUndone"] += 1
        history = (histories or {}).get(oid)
        gen_events = history_generations(history if history is not None else view.get("history") or [])[-1]
        finished = {b: parse_time((rows.get(b) or {}).get("finishedAt")) for b in branches}
        redriven = any(ev.get("event") == "compensationFailed" and ev.get("step") in branches for ev in gen_events)
        if redriven or any(t is None for t in finished.values()):
            reverse["notComparable"] += 1  # a compensation failed and was redriven later, or no finishedAt
            continue
        ended_at = {b: t for b, t in finished.items() if t is not None}
        seqs = {b: seq for b in branches if (seq := fx.undone_at(last, b)) is not None}
        # each pair of branches that finished one after the other: the later one compensated first
        wrong = [(a, b) for a in branches for b in branches if ended_at[a] > ended_at[b] and seqs[a] > seqs[b]]
        if len(set(ended_at.values())) < len(branches):
            reverse["ties"] += 1
        if wrong:
            out_of_order.append({**who, "generation": last,
                                 "finishedAt": {b: (rows.get(b) or {}).get("finishedAt") for b in branches},
                                 "compensationSeq": seqs,
                                 "expected": sorted(branches, key=lambda b: ended_at[b], reverse=True)})
        else:
            reverse["passed"] += 1

    names = _branch_names(registry)
    plans: dict[str, Counter[str]] = {p: Counter() for p in PLANS}
    for r in express:
        if r.express_plan:
            c = plans[r.express_plan]
            c["planned"] += 1
            if r.terminate_status is not None:
                c[f"terminate:{r.terminate_result}"] += 1
            if r.cancel_status is not None:
                c[f"cancel:{r.cancel_result}"] += 1
    summary = {
        "orders": len(express), "outcomes": dict(outcomes), "failedAt": dict(failed_at),
        "restartedOrders": restarted, "generations": generations,
        "reverseOrder": dict(reverse), "stoppedBranches": dict(stopped),
        "rejections": {k: dict(v) for k, v in rejections.items()},
        "bothBranchesStanding": both_standing,
        "plans": {p: dict(c) for p, c in plans.items()},
        "operator": {
            "terminatesSent": sum(1 for r in express if r.terminate_status is not None or r.terminate_lost),
            "terminateResults": dict(Counter(str(r.terminate_result) for r in express
                                             if r.terminate_status is not None)),
            "cancelResults": dict(Counter(str(r.cancel_result) for r in express if r.cancel_status is not None)),
            "restarted": sum(r.restarts_done for r in express),
        },
        "duplicates": {
            "branchRequestCopies": sum(1 for r in express if r.request_copy_step in names),
            "branchReplyCopies": sum(1 for r in express if r.reply_copy_step in names),
            "branchReplyCopiesWhileGroupRan": sum(1 for r in express if r.reply_copy_in_group),
        },
    }
    return {"notExpress": not_express, "outOfOrder": out_of_order, "standing": standing, "byKey": by_key,
            "summary": summary}


def _branch_names(registry: Any) -> set[str]:
    return {s.name for wf in registry.all() if wf.name == EXPRESS_WORKFLOW for s in wf.steps if s.group}


def render_express(summary: Mapping[str, Any]) -> list[str]:
    """The express lines of the printed summary."""
    if not summary or not summary.get("orders"):
        return ["  express: none"]
    rev, st, dup, op = (summary.get(k) or {} for k in ("reverseOrder", "stoppedBranches", "duplicates", "operator"))
    rej = "; ".join(f"{b} refused: {t.get('orders', 0)} orders, {t.get('generations', 0)} generations, other branch "
                    f"undone {t.get('otherUndone', 0)}, tombstoned {t.get('otherTombstoned', 0)}"
                    for b, t in (summary.get("rejections") or {}).items()) or "none"
    plans = "; ".join(f"{p} {', '.join(f'{k} {v}' for k, v in c.items())}"
                      for p, c in (summary.get("plans") or {}).items() if c) or "none"
    return [
        f"  express: {summary['orders']} orders ({summary.get('generations', 0)} generations, "
        f"{summary.get('restartedOrders', 0)} restarted): {summary.get('outcomes', {})}; failed at "
        f"{summary.get('failedAt', {})}",
        f"    both branches undone {rev.get('bothUndone', 0)}: reverse order of completion passed "
        f"{rev.get('passed', 0)} (ties {rev.get('ties', 0)}, not comparable {rev.get('notComparable', 0)}); "
        f"both branches standing on a failed order {summary.get('bothBranchesStanding', 0)}",
        f"    stopped branches: by a failing branch {st.get('byFailure', 0)}, by a terminate "
        f"{st.get('byTerminate', 0)}; compensated by key: tombstones {st.get('tombstones', 0)}, undone "
        f"{st.get('undone', 0)}",
        f"    designed rejections: {rej}",
        f"    plans: {plans}; operator: terminates {op.get('terminatesSent', 0)} "
        f"{op.get('terminateResults', {})}, cancels {op.get('cancelResults', {})}, restarts {op.get('restarted', 0)}",
        f"    duplicates: branch request copies {dup.get('branchRequestCopies', 0)}, branch reply copies "
        f"{dup.get('branchReplyCopies', 0)} ({dup.get('branchReplyCopiesWhileGroupRan', 0)} while the group ran)",
    ]
