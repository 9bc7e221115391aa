"""The chaos run's bulk retry (issue 30): ONE ``POST /api/operations`` retries a batch of failed
orders while a host instance is killed, and no order is acted on twice.

With ``--bulk-orders N`` (``random.Random(f"{seed}:bulk")``): N orders of a customer of their own,
posted first, carry a SKU the inventory refuses, fail at their reservation and wait in
``attention``; a quarter also carry a SKU of their own that stays refused. The runner (``loop``)
restocks the SKU, asks for a dry run until it matches all N, POSTs the retry with an
Idempotency-Key (a lost answer is asked again: the same operation) and kills a host instance
0.2-0.8 s after sending it, and again during the Supervisor's ticks; then polls the operation
until it is ``done``.

The checks (``bulk_outcomes``): the operation is done, matched exactly the batch, and
``matched == succeeded + failed``; no order was acted on twice (one history event with the
operation's id at most, each with ``by``); a succeeded order was restarted exactly once, to
generation 1, and ends Processed, or failed again on its own cause or a chaos fault (never on the
restocked SKU); an instance was killed while the operation ran.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import requests

from bench.chaos_records import ChaosRunner, OrderRec, answer_of, failed_and_undone, post_until_answered
from bench.poll import wait_for
from local.host.keys import ADMIN
from local.stack import demo_order
from shared.core.workflows import DEFAULT_WORKFLOW

BULK_SKU = "SKU-BULK-{seed}"  # inventory refuses it until the operator restocks it
KEPT_SKU = "SKU-BULK-{seed}-{index}"  # ... and these stay refused: the retried order fails again
CUSTOMER = "chaos-bulk-{seed}"
WORKFLOWS = (DEFAULT_WORKFLOW, "digital", "express")  # in turn
KEPT_EVERY = 4  # every 4th bulk order keeps a cause of its own
ACTED = ("restarted", "retried")  # what a retry writes (a failed and undone order: restarted)
KILL_AFTER = (0.2, 0.8)  # seconds after the POST is sent: while it acts on its first slice
FAIL_TIMEOUT = 120.0  # for the batch to fail and be undone
MATCH_TIMEOUT = 60.0  # for the search index to list every one of them
DONE_TIMEOUT = 300.0  # for the operation to be done


class Bulk:
    """Plans the bulk orders and runs the one bulk retry over them (``loop``)."""

    name = "bulk"

    def __init__(self, run: ChaosRunner) -> None:
        self.run = run
        seed = run.o.seed
        self.rng = random.Random(f"{seed}:bulk")
        self.sku = BULK_SKU.format(seed=seed)
        self.customer = CUSTOMER.format(seed=seed)
        self.recs: list[OrderRec] = []
        self.operation_id: str | None = None
        self.started = False  # the POST was sent
        self.finished = False  # done, or given up
        self.operation: dict[str, Any] | None = None  # the last GET's body
        self.post: dict[str, Any] = {}  # what the POST(s) answered
        self.kills: list[dict[str, Any]] = []  # the kills while the operation ran
        self.problems: list[str] = []

    # ---- plan ---------------------------------------------------------------------------------

    def plan(self) -> list[OrderRec]:
        """The bulk orders (indexes after the run's own: posted first, planned by nothing else)."""
        o, rng = self.run.o, self.rng
        for j in range(o.bulk_orders):
            index = o.orders + j
            body = demo_order(rng)
            body["customerId"] = self.customer
            body["items"].append({"sku": self.sku, "quantity": 1, "unitPrice": 3})
            kept = j % KEPT_EVERY == KEPT_EVERY - 1
            if kept:
                body["items"].append({"sku": KEPT_SKU.format(seed=o.seed, index=index), "quantity": 1,
                                      "unitPrice": 2})
            workflow = WORKFLOWS[j % len(WORKFLOWS)]
            if workflow != DEFAULT_WORKFLOW:
                body["workflow"] = workflow
            self.recs.append(OrderRec(index=index, key=f"chaos-{o.seed}-bulk-{j}", body=body, reject=None,
                                      dup_submit=rng.random() < o.duplicate_submit_rate,
                                      dup_delivery=rng.random() < o.duplicate_delivery_rate,
                                      workflow=workflow, bulk=True))
        return self.recs

    def refused_skus(self) -> list[str]:
        """What the inventory refuses for the bulk orders: the batch's SKU (until restocked) and
        the kept causes (never)."""
        if not self.recs:
            return []
        kept = [i["sku"] for r in self.recs for i in r.body["items"] if i["sku"].startswith(f"{self.sku}-")]
        return [self.sku, *kept]

    def kept(self, rec: OrderRec) -> bool:
        return any(i["sku"].startswith(f"{self.sku}-") for i in rec.body["items"])

    def watching(self, rec: OrderRec) -> bool:
        """A bulk order is polled every 0.5 s while the operation runs (and duplicates reach it)."""
        return rec.bulk and self.started and not self.finished

    def pending(self) -> bool:
        return bool(self.recs) and not self.finished

    def behind(self, rec: OrderRec) -> bool:
        """A bulk order whose last view predates the operation's restart of it (a poll read it before
        the operation reached it): polled again, and not settled, until it shows generation 1 (unless
        the operation, done, counted failures: then some may never be restarted)."""
        if not rec.bulk_restarts or int((rec.view or {}).get("generation") or 0) >= rec.bulk_restarts:
            return False
        return not (self.finished and (self.operation or {}).get("failed"))

    # ---- the operator's bulk retry --------------------------------------------------------------

    def loop(self) -> None:
        run = self.run
        try:
            self._loop()
        except Exception as e:  # noqa: BLE001
            run.errors.append(f"bulk retry: {type(e).__name__}: {e}")
        finally:
            self.finished = True

    def _loop(self) -> None:
        run = self.run
        if not self.recs:
            return

        def all_failed() -> bool:
            with run.lock:
                return all(r.order_id and failed_and_undone(r.view) for r in self.recs)

        if not wait_for(all_failed, (run.o.orders + len(self.recs)) / run.o.rate + FAIL_TIMEOUT,
                        stop=run.stop):
            with run.lock:
                left = [(r.order_id, r.state) for r in self.recs if not failed_and_undone(r.view)]
            raise RuntimeError(f"bulk orders not failed and undone in time: {left[:5]}")
        run.remove_remote_cause("restock", self.sku)
        run.event("bulk-fix", sku=self.sku, orders=len(self.recs))
        body = {"action": "retry", "filter": {"state": "attention", "customerId": self.customer}}
        matched = 0

        def all_matched() -> bool:
            nonlocal matched
            status, answer = self._call("post", "/operations", json={**body, "dryRun": True})
            matched = int(answer.get("matched") or 0) if status == 200 else matched
            return matched == len(self.recs)

        if not wait_for(all_matched, MATCH_TIMEOUT, stop=run.stop):
            self.problems.append(f"the dry run matched {matched} of {len(self.recs)} bulk orders")
        run.say(f"  ! bulk retry of {len(self.recs)} orders (customer {self.customer}): POST /api/operations")
        with run.lock:
            for r in self.recs:  # each order is watched again: the operation restarts it
                r.bulk_restarts = 1
                r.repoll()
        self.started = True
        t_post = time.monotonic()
        killer = threading.Thread(target=self._kills, args=(t_post,), name="bulk-kills", daemon=True)
        killer.start()
        self._start(body)
        if self.operation_id is None:
            raise RuntimeError(f"the bulk POST was never answered 202: {self.post}")

        def done() -> bool:
            status, answer = self._call("get", f"/operations/{self.operation_id}")
            if status == 200:
                self.operation = answer
            return bool(self.operation) and self.operation.get("state") == "done"  # type: ignore[union-attr]

        ok = wait_for(done, DONE_TIMEOUT, stop=run.stop)
        self.post["seconds"] = round(time.monotonic() - t_post, 2)
        killer.join(timeout=90)
        counts = {k: (self.operation or {}).get(k) for k in ("state", "matched", "succeeded", "failed")}
        run.event("bulk-done" if ok else "bulk-not-done", operationId=self.operation_id, seconds=self.post["seconds"],
                  operation=counts)
        run.say(f"  ! bulk retry {self.operation_id} after {self.post['seconds']}s: {counts}")

    def _start(self, body: dict[str, Any]) -> None:
        """POST the operation; an answer lost (a killed instance) or a 409 (being started) is asked
        again with the same key."""
        assert self.run.stack is not None
        status, answer, lost = post_until_answered(
            self.run, f"{self.run.stack.api_url}/operations", timeout=60, again=lambda status, _: status == 409,
            json=body, headers={"Idempotency-Key": f"chaos-{self.run.o.seed}-bulk-retry"})
        if status == 202:
            self.operation_id = str(answer["operationId"])
            self.post.update(status=202, answersLost=lost, firstAnswer=answer)
        else:
            self.post.update(status=status, answersLost=lost, **({"answer": answer} if status else {}))

    def _kills(self, t_post: float) -> None:
        """Kill an instance while the POST acts on its first slice, then again once it answered,
        if the Supervisor's ticks still carry the operation."""
        run = self.run
        if run.stop.wait(self.rng.uniform(*KILL_AFTER)):
            return
        for when in ("post", "ticks"):
            if when == "ticks":
                wait_for(lambda: self.operation_id, t_post + 60 - time.monotonic(), every=0.1, stop=run.stop)
                if (self.operation or self.post.get("firstAnswer") or {}).get("state") != "running":
                    return
            progress = {k: (self.operation or self.post.get("firstAnswer") or {}).get(k)
                        for k in ("succeeded", "failed")}
            before, at = run.faults["hostInstanceKills"], round(time.monotonic() - t_post, 2)
            answered = self.operation_id is not None
            run.kill_instance()  # (returns once the host restarted it)
            if run.faults["hostInstanceKills"] > before:
                self.kills.append({"during": when, "afterSeconds": at, "postAnswered": answered, **progress})

    def _call(self, method: str, path: str, **kw: Any) -> tuple[int | None, dict[str, Any]]:
        """One call to an operator route (``/operations``: the master key) -> (status or None, answer)."""
        assert self.run.stack is not None
        try:
            r = self.run.session(ADMIN).request(method, f"{self.run.stack.api_url}{path}", timeout=60, **kw)
        except requests.RequestException:
            return None, {}
        return r.status_code, answer_of(r)

    def report(self, views: dict[str, tuple[int | None, dict[str, Any] | None]],
               histories: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        return bulk_outcomes(self.recs, self.kept, self.operation_id, self.operation, views, histories,
                             kills=self.kills, post=self.post, problems=self.problems)


def bulk_outcomes(recs: list[OrderRec], kept: Any, operation_id: str | None, operation: dict[str, Any] | None,
                  views: dict[str, tuple[int | None, dict[str, Any] | None]],
                  histories: dict[str, list[dict[str, Any]]], *, kills: list[dict[str, Any]],
                  post: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """The bulk retry's checks (see the module's doc) -> {"checks": ..., "summary": ..., "examples": ...}."""
    op = operation or {}
    twice, not_once, wrong_end, no_by = [], [], [], []
    acted_on = failed_again = 0
    for r in recs:
        if not r.order_id:
            continue
        status, view = views.get(r.order_id, (None, None))
        view = (view if status == 200 else None) or r.view or {}
        history = histories.get(r.order_id) or view.get("history") or []
        mine = [e for e in history if operation_id and (e.get("detail") or {}).get("operationId") == operation_id]
        who = {"orderId": r.order_id, "events": [e.get("event") for e in mine]}
        if len(mine) > 1:
            twice.append(who)
        acted_on += bool(mine)
        if any(not (e.get("detail") or {}).get("by") for e in mine):
            no_by.append(who)
        if [e.get("event") for e in mine] not in ([], ["restarted"]):
            not_once.append(who)
        gen, state, outcome = int(view.get("generation") or 0), view.get("processState"), view.get("outcome")
        reason = str(view.get("reason") or "")
        failed = state == "Error" and outcome == "failed"
        if kept(r):  # its own SKU is still refused: it cannot go through
            right = failed
        else:  # restocked: Processed, or failed again on a chaos fault (a timeout...), never on the SKU
            right = state == "Processed" or (failed and not any(i["sku"] in reason for i in r.body["items"]
                                                                if i["sku"].startswith("SKU-BULK-")))
            failed_again += right and failed
        if gen != 1 or not right:
            wrong_end.append({**who, "generation": gen, "processState": state, "outcome": outcome,
                              "reason": reason, "expected": {"generation": 1, "keptCause": kept(r)}})
    n = sum(1 for r in recs if r.order_id)
    matched, succeeded, failed = (int(op.get(k) or 0) for k in ("matched", "succeeded", "failed"))
    during = [k for k in kills if k.get("during")]
    checks = {
        "bulkOperationDone": {"value": op.get("state"), "expected": "done", "ok": op.get("state") == "done"},
        "bulkMatchedOtherThanTheBatch": {"value": matched - n, "expected": 0, "ok": matched == n > 0},
        "bulkCountsNotAddingUp": {"value": matched - succeeded - failed, "expected": 0,
                                  "ok": matched == succeeded + failed},
        "bulkOrdersActedOnTwice": {"value": len(twice), "expected": 0, "ok": not twice},
        "bulkSucceededNotRestartedOnce": {"value": abs(succeeded - (acted_on - len(not_once))) + len(not_once),
                                          "expected": 0, "ok": not not_once and acted_on == succeeded},
        "bulkEventsWithoutBy": {"value": len(no_by), "expected": 0, "ok": not no_by},
        "bulkOrdersEndedWrongly": {"value": len(wrong_end), "expected": 0, "ok": not wrong_end},
        "bulkKillsWhileRunning": {"value": len(during), "expected": ">= 1", "ok": bool(during)},
        "bulkProblems": {"value": len(problems), "expected": 0, "ok": not problems},
    }
    summary = {"orders": n, "keptCause": sum(1 for r in recs if kept(r)), "operationId": operation_id,
               "matched": matched, "succeeded": succeeded, "failed": failed, "errors": op.get("errors") or [],
               "actedOn": acted_on, "fixedButFailedAgainOnAFault": failed_again,
               "post": {k: v for k, v in post.items() if k != "firstAnswer"},
               "firstSlice": {k: (post.get("firstAnswer") or {}).get(k) for k in ("state", "succeeded", "failed")},
               "kills": kills}
    examples = {"bulkActedTwice": twice[:20], "bulkNotOnce": not_once[:20], "bulkEndedWrongly": wrong_end[:20],
                "bulkNoBy": no_by[:20], "bulkProblems": problems[:20]}
    return {"checks": checks, "summary": summary, "examples": examples}


def render_bulk(bulk: dict[str, Any]) -> list[str]:
    """The summary's lines about the bulk retry (none when the run had none)."""
    if not bulk:
        return []
    s = bulk["summary"]
    kills = ", ".join(f"{k['during']} at {k['afterSeconds']}s" for k in s["kills"]) or "none"
    return [f"  bulk retry {s['operationId']}: {s['orders']} orders ({s['keptCause']} with a cause of their own "
            f"kept): matched {s['matched']}, succeeded {s['succeeded']}, failed {s['failed']}, acted on "
            f"{s['actedOn']} ({s.get('fixedButFailedAgainOnAFault', 0)} fixed but failed again on a fault); POST "
            f"{s['post'].get('status')} ({s['post'].get('answersLost', 0)} answers lost), first slice "
            f"{s['firstSlice']}, done after {s['post'].get('seconds')}s; instance kills while it ran: {kills}"]
