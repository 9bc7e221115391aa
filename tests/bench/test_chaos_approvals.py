"""The chaos run's approvals (bench/chaos_approvals.py): the plan, the run's own workflows
directory, what the runner sends when, and how an answer is judged. No stack is started; the
checks on made-up outcomes are in tests/e2e/test_chaos.py."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from bench.chaos import REJECT_AMOUNT_OVER, ChaosRun, main, render_summary, replay_command
from bench.chaos_approvals import (
    APPROVING,
    KINDS,
    NEVER_WITHIN,
    RESTARTABLE_KINDS,
    answer_ok,
    generations,
    order_facts,
    served_wait_timeouts,
    wait_step,
    write_workflows,
)
from bench.chaos_records import ChaosOptions, EventSend, OrderRec
from shared.core.workflows import load_directory, load_registry, workflows_directory
from shared.core.workflows.catalog import AGENTS_BY_NAME

CI = {"orders": 200, "seed": 20261122, "reject_rate": 0.02, "terminate_rate": 0.05, "fixable_rate": 0.015,
      "digital_share": 0.3}


def _planned(**kw: Any) -> ChaosRun:
    run = ChaosRun(ChaosOptions(out=None, **{**CI, **kw}))
    run.plan_orders()
    run.operator.plan()
    run.approvals.plan()
    return run


def _total(body: dict[str, Any]) -> Decimal:
    return Decimal(order_facts(body)["total"])


# ---- the plan ----------------------------------------------------------------------------------


def test_every_order_that_waits_has_a_plan_and_every_kind_is_played() -> None:
    run = _planned()
    registry = load_registry()
    for r in run.recs:  # the plan is what the workflow's when says of the order's body
        waits = wait_step(registry.latest(r.workflow), r.body) is not None
        assert waits == (r.approval is not None), (r.index, r.workflow, _total(r.body))
    share = [r for r in run.recs if r.approval and not r.approval.designed]
    assert len(share) == 20  # 10% of 200
    assert Counter(r.approval.kind for r in share if r.approval) == {
        "onTime": 4, "early": 4, "late": 3, "twice": 3, "declined": 3, "never": 3}
    for r in share:  # over the approval threshold, under the payment limit; none the operator acts on
        assert 1000 < _total(r.body) < Decimal(REJECT_AMOUNT_OVER), r.body
        assert r.workflow == "order" and r.reject is None and r.fix is None and r.terminate_after is None
    # the never-approved ones are among the first orders: their timeouts end within the run
    assert all(r.index < NEVER_WITHIN * 200 for r in share if r.approval and r.approval.kind == "never")


def test_the_designed_causes_over_the_threshold_are_approved() -> None:
    run = _planned()
    designed = [r for r in run.recs if r.approval and r.approval.designed]
    assert {(r.reject, r.fix) for r in designed} == {("amount", None), (None, "limit")}
    for r in designed:  # restarted by the operator: no copy of an event may reach its next generation
        assert r.approval is not None and r.approval.kind in RESTARTABLE_KINDS and r.restarts_planned >= 1
    assert set(RESTARTABLE_KINDS) < set(APPROVING) < set(KINDS)
    # the out-of-stock rejections and the digital orders do not wait
    assert all(r.approval is None for r in run.recs if r.reject == "sku" or r.workflow == "digital")


def test_an_early_approval_holds_its_reservation_until_it_is_answered() -> None:
    run = _planned()
    early = [r for r in run.recs if r.approval and r.approval.kind == "early"]
    assert early and all(r.approval and r.approval.hold_sku == f"SKU-HOLD-{r.index}" for r in early)
    assert all(any(i["sku"] == r.approval.hold_sku for i in r.body["items"]) for r in early if r.approval)
    assert sorted(run.approvals.held_skus()) == sorted(r.approval.hold_sku for r in early if r.approval)

    class Remotes:
        def __init__(self) -> None:
            self.faults: dict[str, dict[str, Any]] = {}

        def set_faults(self, svc: str, **faults: Any) -> None:
            self.faults[svc] = faults

    class Stack:
        remotes = Remotes()

    run.stack = Stack()  # type: ignore[assignment]
    run.apply_remote_faults()
    held = run.approvals.held_skus()
    assert run.stack.remotes.faults["inventory"]["hangSkus"] == held  # type: ignore[attr-defined]
    run.remove_remote_cause("hold", held[0])  # the early event was answered
    assert run.stack.remotes.faults["inventory"]["hangSkus"] == held[1:]  # type: ignore[attr-defined]
    run.remote_faults_off()  # the chaos faults off: the holds not released yet stay
    assert run.stack.remotes.faults["inventory"]["hangSkus"] == held[1:]  # type: ignore[attr-defined]


def test_the_plan_replays_from_the_seed_and_leaves_the_rest_of_it_as_it_was() -> None:
    one, two = _planned(), _planned()
    assert [(r.body, r.approval and r.approval.kind) for r in one.recs] == [
        (r.body, r.approval and r.approval.kind) for r in two.recs]
    assert [r.approval and r.approval.kind for r in _planned(seed=7).recs] != [
        r.approval and r.approval.kind for r in one.recs]
    none = _planned(approval_share=0.0)
    assert not [r for r in none.recs if r.approval and not r.approval.designed]
    for a, b in zip(one.recs, none.recs, strict=True):  # only the approval-share orders' bodies differ
        if not (a.approval and not a.approval.designed):
            assert (a.body, a.terminate_after, a.fix, a.reject) == (b.body, b.terminate_after, b.fix, b.reject)


def test_the_options_on_the_command_line_and_in_the_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    opts = ChaosOptions(orders=10, seed=1, approval_share=0.2, approval_timeout=40).resolved()
    assert "--approval-share 0.2" in replay_command(opts) and "--approval-timeout 40" in replay_command(opts)
    assert "--approval" not in replay_command(ChaosOptions(orders=10, seed=1).resolved())
    for bad in ({"approval_share": 1.5}, {"approval_timeout": 5}):
        with pytest.raises(ValueError, match="--approval"):
            ChaosOptions(**bad).resolved()  # type: ignore[arg-type]
    # the command line's options reach the run, and its replay gives them back
    import signal

    from bench import chaos

    monkeypatch.setattr(signal, "signal", lambda *_: None)  # main installs handlers of its own
    given: list[ChaosOptions] = []
    monkeypatch.setattr(chaos, "run_chaos", lambda o: given.append(o) or {"ok": True})
    argv = ["--seed", "1", "--orders", "10", "--approval-share", "0.2", "--approval-timeout", "40",
            "--no-azurite-restart", "--no-operator-retry", "--out", ""]
    assert main(argv) == 0
    [o] = given
    assert (o.approval_share, o.approval_timeout, o.out) == (0.2, 40, None)
    assert (o.restart_azurite, o.restart_servicebus, o.operator_retry, o.operator_restarts) == (
        False, True, False, True)
    assert replay_command(o.resolved()) == (".venv/bin/python -m bench.chaos --seed 1 --orders 10 --no-azurite-restart "
                                            "--no-operator-retry --approval-share 0.2 --approval-timeout 40")


# ---- the run's own workflows --------------------------------------------------------------------


def test_the_run_writes_its_own_workflows_with_short_waits(tmp_path: Path) -> None:
    waits = write_workflows(tmp_path / "wf", 30)
    assert waits == {"order v2/approval": 30}
    ours, app = load_directory(tmp_path / "wf", AGENTS_BY_NAME), load_registry()
    assert [wf.key for wf in ours.all()] == [wf.key for wf in app.all()]
    for mine, theirs in zip(ours.all(), app.all(), strict=True):  # only the waits' timeouts differ
        for a, b in zip(mine.steps, theirs.steps, strict=True):
            assert a.timeout_seconds == (30 if b.kind == "wait" else b.timeout_seconds)
            assert (a.name, a.kind, a.when, a.on_timeout, a.event) == (b.name, b.kind, b.when, b.on_timeout, b.event)
    assert {p.name for p in (tmp_path / "wf").iterdir()} == {
        p.name for p in workflows_directory().iterdir() if p.suffix == ".yaml"}
    # as GET /api/workflows shows them
    shown = [wf.to_json() for wf in ours.all()]
    assert served_wait_timeouts(shown) == waits


# ---- what is sent when ----------------------------------------------------------------------------


def _waiting(generation: int = 0) -> dict[str, Any]:
    return {"processState": "Processing", "generation": generation,
            "awaiting": {"step": "approval", "kind": "event", "event": "approval"}}


def _rec(run: ChaosRun, kind: str) -> OrderRec:
    rec = next(r for r in run.recs if r.approval and r.approval.kind == kind and not r.approval.designed)
    rec.order_id = f"o-{rec.index}"
    return rec


def _did(rec: OrderRec, what: str, generation: int = 0) -> None:
    assert rec.approval is not None
    rec.approval.sends.append(EventSend(what, generation, None, {}))


def test_when_each_kind_sends_its_events() -> None:
    run = _planned()
    ap = run.approvals
    early = _rec(run, "early")
    assert ap.due(early, 0.0) == "early"  # at acceptance, before anything is seen
    _did(early, "early")
    early.approval.handled.add(0)  # type: ignore[union-attr]
    early.view = _waiting()
    assert ap.due(early, 0.0) is None and not ap.pending(early)

    on_time = _rec(run, "onTime")
    assert ap.due(on_time, 0.0) is None and ap.watching(on_time)  # not waiting yet, but watched closely
    on_time.view = _waiting()
    assert ap.due(on_time, 0.0) == "approve"

    late = _rec(run, "late")
    late.view = _waiting()
    ap.notice(late, 100.0)
    wait = late.approval.late_seconds  # type: ignore[union-attr]
    assert ap.due(late, 100.0 + wait - 0.1) is None and ap.due(late, 100.0 + wait) == "approve"
    assert ap.pending(late)  # owed, later

    declined = _rec(run, "declined")
    declined.view = _waiting()
    assert ap.due(declined, 0.0) == "decline"

    twice = _rec(run, "twice")
    twice.view = _waiting()
    assert ap.due(twice, 0.0) == "approve"
    _did(twice, "approve")
    assert ap.due(twice, 0.0) == "copy"
    _did(twice, "copy")
    assert ap.due(twice, 0.0) == "different"
    _did(twice, "different")
    assert ap.due(twice, 0.0) is None

    never = _rec(run, "never")
    never.view = _waiting()
    assert ap.due(never, 1e9) is None and not ap.watching(never)  # nothing, however long it waits
    never.view = {"processState": "Error", "outcome": "failed", "compensation": {"state": "completed"}}
    assert ap.due(never, 0.0) == "tooLate"  # once it ended: an event too late


def test_each_generation_of_a_restarted_order_is_approved_again() -> None:
    run = _planned()
    rec = next(r for r in run.recs if r.approval and r.approval.designed)
    rec.order_id = "r1"
    plan = rec.approval
    assert plan is not None
    plan.handled.add(0)  # generation 0 got its event (early, on time or late)
    plan.sends.append(EventSend("early" if plan.kind == "early" else "approve", 0, "k", {}))
    rec.view = {"processState": "Error", "outcome": "failed", "generation": 0}
    assert run.approvals.due(rec, 0.0) is None and not run.approvals.watching(rec)
    rec.view = _waiting(generation=1)  # restarted by the operator: it waits again
    assert run.approvals.watching(rec) and run.approvals.due(rec, 1e9) == "approve"


def test_an_order_found_waiting_with_no_plan_is_approved_and_counted() -> None:
    run = _planned()
    rec = next(r for r in run.recs if r.approval is None)
    rec.order_id, rec.view = "x1", _waiting()
    run.approvals.notice(rec, 0.0)
    assert rec.approval is not None and rec.approval.unplanned and rec.approval.kind == "onTime"
    assert run.approvals.due(rec, 0.0) == "approve"


# ---- judging answers ------------------------------------------------------------------------------


def _answer(what: str, status: int, result: str | None, lost: int = 0, problem: str | None = None,
            pair: int | None = None) -> EventSend:
    return EventSend(what, 0, "k", {}, status=status, result=result, lost=lost, problem=problem, pair=pair)


def test_answers_are_judged_by_what_was_sent() -> None:
    assert answer_ok(_answer("approve", 202, "step-done"))
    assert not answer_ok(_answer("approve", 202, "event-duplicate"))
    assert answer_ok(_answer("approve", 202, "event-duplicate", lost=1))  # its own event, applied before
    assert answer_ok(_answer("early", 202, "event-kept")) and not answer_ok(_answer("early", 202, "step-done"))
    assert answer_ok(_answer("decline", 202, "compensating"))
    assert answer_ok(_answer("copy", 202, "event-duplicate")) and not answer_ok(_answer("copy", 202, "step-done"))
    assert answer_ok(_answer("copy", 202, "step-done", pair=0))  # sent at once with the first: it may win
    assert answer_ok(_answer("different", 409, "409", problem="wrong-state"))
    assert not answer_ok(_answer("different", 409, "409", problem="conflict"))
    assert not answer_ok(_answer("tooLate", 202, "step-done")) and not answer_ok(_answer("approve", None, None))
    assert answer_ok(_answer("tooLate", 409, "409", problem="wrong-state").to_json())


def test_a_history_is_cut_into_generations_at_each_restart() -> None:
    events = [{"event": "accepted"}, {"event": "stepDone"}, {"event": "restarted"}, {"event": "stepDone"},
              {"event": "restarted"}]
    assert [len(g) for g in generations(events)] == [2, 2, 1]
    assert generations([]) == [[]]


def test_the_summary_prints_the_approvals() -> None:
    from tests.bench.test_chaos_outage import _minimal_report

    report = _minimal_report({})
    del report["outage"]
    report["approvals"] = {"timeoutSeconds": {"order v2/approval": 30}, "orders": 3,
                           "plans": {"onTime": 1, "never": 1}, "outcomes": {"onTime": {"processed": 1},
                                                                            "never": {"failed": 1}},
                           "designed": {"orders": 1, "plans": {"late": 1}, "outcomes": {"late": {"failed": 1}}},
                           "eventsSent": 2, "answers": {"step-done": 2}, "earlyKept": 0, "timedOut": 1}
    text = render_summary(report)
    assert "approvals (order v2/approval 30 s): 3 orders waited: onTime 1 (processed 1)" in text
    assert "never 1 (failed 1); for a designed cause 1: late 1 (failed 1)" in text and "timed out 1" in text
