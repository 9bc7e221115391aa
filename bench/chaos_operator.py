"""The chaos run's operator (issue 11): terminates orders in flight, restarts failed ones, and
redrives compensations that failed for good, while every other fault goes on.

Its plan (``random.Random(f"{seed}:operator")``, so a seed replays it):

* **terminate**: ``terminate_rate`` of the orders get ``POST /orders/{id}/terminate`` within
  ``terminate_within`` s of their acceptance (202 ``terminated``/``terminating``/``held``, or 409);
* **restart**: each designed rejection is restarted once (a third twice) once it failed and was
  compensated; the cause stays, so each generation fails again and must be undone on its own;
* **fix, then act**: ``fixable_rate`` of the orders carry a cause of their own, which stays when the
  faults go off: ``restock`` (a SKU out of stock: restocked, restarted, generation 1 goes through),
  ``limit`` (over the payment limit: raised, restarted) and ``stall`` (the payment hangs on the
  order: terminated while its charge hangs, the refund hangs too until it fails for good; then the
  cause is fixed and the compensation redriven: the order ends ``terminated`` with nothing applied);
* express orders get the above, and their own paths (``bench.chaos_express``).

Every action and its answer is recorded on the order (``OrderRec.operator_actions``); the
checks (``bench.chaos.evaluate``) judge the outcomes.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import requests

from bench.chaos_express import at_pivot
from bench.chaos_records import Actor, failed_and_undone, is_held, post_until_answered, problem_of

if TYPE_CHECKING:
    from bench.chaos_records import ChaosRunner, OrderRec

RESTOCK_SKU = "SKU-BO-{index}"  # inventory refuses it until the operator restocks it
STALL_SKU = "SKU-STALL-{index}"  # the payment service hangs on it until the operator fixes it
LIMIT_UNIT_PRICE = 52000  # over the payment limit (50000), under the designed rejections (> 60000)
RAISED_LIMIT = "55000"  # the operator's fix for the ``limit`` orders
FIX_KINDS = ("stall", "limit", "restock")
TERMINATED_RESULTS = ("terminated", "terminating")
IN_FLIGHT_STATES = ("Pending", "Processing")
CHARGE_STEP = "charge-payment"
CANCEL_RESULTS = ("cancelling", "cancelled")
MAX_REDRIVES = 2


def charging(view: dict[str, Any] | None) -> bool:
    """The order runs its charge (sent, or waiting to be sent again): in flight at the payment. In
    a parallel step (express) the current step is the group's: its charge branch runs."""
    if not view or view.get("processState") not in IN_FLIGHT_STATES:
        return False
    current = view.get("currentStep")
    if current == CHARGE_STEP:
        return True
    return any(s.get("name") == CHARGE_STEP and s.get("group") == current and current
               and s.get("state") in ("Running", "Waiting") for s in view.get("steps") or [])


def compensation_failed(view: dict[str, Any] | None) -> bool:
    """A compensation failed for good and nothing still runs: what a retry redrives."""
    if not view or view.get("processState") != "Error":
        return False
    comp = view.get("compensation") or {}
    return comp.get("state") == "failed" and not comp.get("pending")


class Operator(Actor):
    """Plans the operator's actions and takes them from a thread of its own (``loop``)."""

    name = "operator"

    def __init__(self, run: ChaosRunner) -> None:
        super().__init__(run)
        self.rng = random.Random(f"{run.o.seed}:operator")

    # ---- plan ---------------------------------------------------------------------------------

    def plan(self) -> None:
        """Mark the orders (after ``plan_orders``): fixable causes, restarts, terminates."""
        o, rng, recs = self.run.o, self.rng, self.run.recs
        free = [r for r in recs if r.reject is None]
        n_fix = min(len(free), round(o.orders * o.fixable_rate))
        kinds = [FIX_KINDS[i % len(FIX_KINDS)] for i in range(n_fix)]
        # A stall's path is long (three refund timeouts, more if missed in flight): the first orders.
        early = [r for r in free if r.index < max(1, len(recs) // 20)]
        stalls = rng.sample(early, min(len(early), kinds.count("stall")))
        rest = [r for r in free if r not in stalls]
        others = rng.sample(rest, min(len(rest), n_fix - len(stalls)))
        planned = [*((r, "stall") for r in stalls), *zip(others, [k for k in kinds if k != "stall"], strict=False)]
        for r, kind in planned:
            r.fix, r.restarts_planned = kind, 1
            if kind == "limit":
                r.body["items"].append({"sku": "SKU-LUX", "quantity": 1, "unitPrice": LIMIT_UNIT_PRICE})
            else:
                r.fix_sku = (STALL_SKU if kind == "stall" else RESTOCK_SKU).format(index=r.index)
                r.body["items"].append({"sku": r.fix_sku, "quantity": 1, "unitPrice": 7})
        if o.operator_restarts:
            for r in recs:
                if r.reject is not None:
                    r.restarts_planned = 2 if rng.random() < 1 / 3 else 1
        candidates = [r for r in free if r.fix is None]
        n_term = min(len(candidates), round(o.orders * o.terminate_rate))
        for r in sorted(rng.sample(candidates, n_term), key=lambda r: r.index):
            r.terminate_after = round(rng.uniform(0.0, o.terminate_within), 3)

    def remote_causes(self) -> dict[str, list[str]]:
        """The per-order causes the remotes start with: SKUs inventory refuses (restock), SKUs
        the payment service hangs on (stall), orders over the payment limit (limit)."""
        recs = self.run.recs
        return {kind: [r.fix_sku or r.key for r in recs if r.fix == kind] for kind in FIX_KINDS}

    @staticmethod
    def watching(rec: OrderRec) -> bool:
        """Whether the operator watches the order closely (polled every 0.5 s while in flight):
        one with a cause of its own, to act on it as soon as it can (or an express order's
        designed path: ``bench.chaos_express``)."""
        return rec.fix is not None or rec.express_plan is not None

    @staticmethod
    def stall_to_stop(rec: OrderRec) -> bool:
        """A stall not terminated yet: terminated as soon as it is seen charging."""
        return rec.fix == "stall" and rec.terminate_status is None and not rec.terminate_gave_up

    # ---- acting -------------------------------------------------------------------------------

    def due(self, rec: OrderRec, now: float) -> str | None:
        """The action the operator owes ``rec`` now, if any."""
        if not rec.order_id:
            return None
        if self.stall_to_stop(rec) and charging(rec.view):
            return "terminate"
        if (rec.express_plan == "pivotCancel" and rec.terminate_status is None and not rec.terminate_gave_up
                and at_pivot(rec.view)):
            return "terminate"  # at its shipment, which hangs: held
        if (rec.express_plan == "pivotCancel" and rec.cancel_status is None and not rec.cancel_gave_up
                and is_held(rec.view)):
            return "cancel"  # the shipment never went (the shipping service hangs on the order)
        if (rec.terminate_after is not None and rec.terminate_status is None and not rec.terminate_gave_up
                and rec.accepted_at is not None and rec.accepted_at + rec.terminate_after <= now):
            return "terminate"
        if rec.fix and compensation_failed(rec.view) and rec.redrives_tried < MAX_REDRIVES:
            return "redrive"
        if rec.restarts_tried < rec.restarts_planned and failed_and_undone(rec.view):
            return "restart"
        return None

    def act(self, rec: OrderRec, action: str) -> None:
        if action == "terminate":
            self.terminate(rec)
        elif action == "cancel":
            self.cancel(rec)
        else:  # redrive, restart: the order's own cause fixed first
            self.fix_cause(rec)
            self.retry(rec, "compensation-redriven" if action == "redrive" else "restarted")

    def fix_cause(self, rec: OrderRec) -> None:
        """Remove the order's own cause of failure: restock its SKU, raise the payment limit,
        or stop the payment service hanging on it."""
        if rec.fix is None or rec.fixed:
            return
        self.run.remove_remote_cause(rec.fix, rec.fix_sku)
        with self.run.lock:
            rec.fixed = True
            self.run.faults["operatorFixedCauses"] += 1
        self.run.event("operator-fix", orderId=rec.order_id, cause=rec.fix, sku=rec.fix_sku)

    def terminate(self, rec: OrderRec) -> None:
        if rec.express_plan == "groupTerminate" and rec.express_hold_sku:
            # the reservation hangs until now: lift the hold so that its compensation goes through
            self.run.remove_remote_cause("hold", rec.express_hold_sku)
        status, body, lost, result = self._call(rec, "terminate")
        with self.run.lock:
            rec.terminate_status, rec.terminate_result, rec.terminate_lost = status, result, lost
            rec.terminate_state = body.get("processState")
            rec.terminate_gave_up = status is None
        if status == 202:
            self.run.faults["operatorTerminates"] += 1
        self.run.event("operator-terminate", orderId=rec.order_id, status=status, result=result,
                       afterSeconds=rec.terminate_after)
        when = ("while its charge hangs" if rec.fix == "stall" else "at its shipment"
                if rec.express_plan == "pivotCancel" else f"{rec.terminate_after}s after acceptance")
        self.run.say(f"  ! terminate {rec.order_id} ({when}): {status} {result}")

    def cancel(self, rec: OrderRec) -> None:
        """Cancel a held order: its done steps are compensated, and it ends ``cancelled``."""
        status, body, lost, result = self._call(rec, "cancel", expected=list(CANCEL_RESULTS))
        with self.run.lock:
            rec.cancel_status, rec.cancel_result, rec.cancel_lost = status, result, lost
            rec.cancel_gave_up = status is None
        if status == 202:
            self.run.faults["operatorCancels"] += 1
        self.run.event("operator-cancel", orderId=rec.order_id, status=status, result=result)
        self.run.say(f"  ! cancel {rec.order_id} (held at its shipment): {status} {result or body.get('detail')}")

    def retry(self, rec: OrderRec, expected: str) -> None:
        status, body, lost, _ = self._call(rec, "retry", expected=expected)
        result = body.get("result")
        with self.run.lock:
            if expected == "restarted":
                rec.restarts_tried += 1
                rec.restarts_done += status == 202 and result == "restarted"
                rec.restarts_unanswered += lost
            else:
                rec.redrives_tried += 1
                rec.redrives_done += status == 202 and result == "compensation-redriven"
        key = {"restarted": "operatorRestarts", "compensation-redriven": "operatorCompensationRedrives"}[expected]
        if status == 202 and result == expected:
            self.run.faults[key] += 1
        self.run.event("operator-retry", orderId=rec.order_id, expected=expected, status=status, result=result)
        self.run.say(f"  ! retry {rec.order_id} (expecting {expected}): {status} {result or body.get('detail')}")

    def _call(self, rec: OrderRec, action: str, **extra: Any) -> tuple[int | None, dict[str, Any], int, str | None]:
        """POST the action (``post_until_answered``), record it and its answer on the order, and poll
        the order again if it may have changed. -> (status, body, answers lost, a 202's result or the
        problem's type)."""
        assert self.run.stack is not None
        status, body, lost = post_until_answered(self.run, f"{self.run.stack.api_url}/orders/{rec.order_id}/{action}")
        with self.run.lock:
            rec.operator_actions.append({
                "t": round(self.run.elapsed(), 2), "action": action, "status": status, "result": body.get("result"),
                "processState": body.get("processState"), "detail": body.get("detail"), "answersLost": lost, **extra})
            if status == 202 or lost:
                rec.repoll()
        return status, body, lost, body.get("result") if status == 202 else problem_of(body)


SEARCH_STATES = ("inFlight", "attention", "processed", "error")


def search_listing(session: requests.Session, api_url: str, page: int = 200,
                   max_pages: int = 1000) -> tuple[dict[str, list[str]], list[str]]:
    """What an operator finds by search: order ids listed under each ``state`` (every page of
    ``GET /orders?state=``), and the problems met (an answer that is not a page). Search is an
    operator route: ``session`` sends the master key."""
    listed: dict[str, list[str]] = {}
    problems: list[str] = []
    for state in SEARCH_STATES:
        ids: list[str] = []
        token: str | None = None
        for _ in range(max_pages):
            params = {"state": state, "limit": str(page), **({"continuationToken": token} if token else {})}
            try:
                r = session.get(f"{api_url}/orders", params=params, timeout=30)
                body = r.json() if r.status_code == 200 else None
            except (requests.RequestException, ValueError) as e:
                problems.append(f"search state={state}: {type(e).__name__}: {e}")
                break
            if not isinstance(body, dict) or not isinstance(body.get("orders"), list):
                problems.append(f"search state={state}: HTTP {r.status_code} {r.text[:200]}")
                break
            ids += [str(o.get("orderId")) for o in body["orders"] if isinstance(o, dict)]
            token = body.get("continuationToken")
            if not token:
                break
        listed[state] = ids
    return listed, problems
