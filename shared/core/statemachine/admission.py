"""A customer's room in the decisions (``shared.core.room``; docs/breaker-design.md §8): an order
over its customer's ``CustomerMaxInFlight`` accepted and waiting, its join of the waiters, a
replayed submission's slot given back, and its admission: the claim that starts it. The room's own
reads and writes are ``shared.runtime.rooms``."""

from __future__ import annotations

import logging
from dataclasses import replace

from shared.core.effects import Effect, JoinRoom, LeaveRoom
from shared.core.lease import Lease
from shared.core.room import ROOM_SEQ, waiter_key
from shared.core.rows import OrderRow, StateRow, StepRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.deadlines import cover, drop_index
from shared.core.statemachine.dispatch import dispatch, dispatched, step_sends
from shared.core.statemachine.history import Event, EventKind, commit, event
from shared.core.statemachine.outbox import info, log, status_sends
from shared.core.statemachine.search_index import category_of, reindex
from shared.core.statemachine.verdicts import Decision, Verdict
from shared.core.statemachine.view import View
from shared.core.states import Category, Mode, ProcessState


def waiting_submission(order: OrderRow, order_id: str, pending: list[StepRow], runs: StepRow, room: str, ctx: Ctx,
                       *, accepted: Event) -> list[Effect]:
    """An order over its customer's cap: accepted, and waiting for a slot in its room. Pending,
    unclaimed, no step dispatched and no deadline: it waits on the others, not on a remote, and the
    room's watch (not the order) is the Supervisor's cover. Its admission is the schedule message of
    sequence ``ROOM_SEQ``, sent by whoever gives it a slot (``shared.runtime.rooms``)."""
    index = cover(order_id, ctx.now + ctx.config.index_floor(), ctx, note="room join guard")
    state = StateRow(order_id=order_id, process_state=ProcessState.PENDING, mode=Mode.FORWARD,
                     lease=Lease.unclaimed(), schedule_seq=ROOM_SEQ, step_index=runs.index, step_name=runs.name,
                     created_at=ctx.now, updated_at=ctx.now, index_due=index.due, room=room, waiting_room=True)
    view = View(order, state, tuple(pending))
    return [
        # Crash after this: no order row exists; the sweep deletes the row once it is
        # ORPHAN_INDEX_AGE old. The client saw no 202 and retries.
        index,
        # The ONE write of the order (order + state + step rows): accepted, waiting for its room.
        # Crash after this (not yet among the waiters): the client's retry replays and joins it
        # (plan_replay); without a retry the row above falls due and the Supervisor joins it.
        commit(View(order, None, view.steps), state, (row.create() for row in (order, *view.steps)),
               [accepted,
                event(EventKind.WAITING_ROOM, runs.name, inFlightCap=ctx.config.customer_max_in_flight)],
               ctx, note="submission, waiting for its customer's room"),
        *reindex(order, None, state),
        # The watch row, then the waiter row (then the admission if a slot is free by now).
        # Crash after this: it waits in submission order; its deadline row is deleted next or by
        # the sweep (which finds it waiting and joins it again: a copy finds its row there).
        join_room(view, ctx),
        *status_sends(view, "received", ctx, processState=ProcessState.PENDING),
        info("order.waiting_room", view, room=room, step=runs.name),
        # Crash before this: the row falls due; the sweep joins it again (nothing new), then deletes it.
        *drop_index(state),
    ]


def join_room(view: View, ctx: Ctx) -> JoinRoom:
    """The waiter row of an order that waits for its room (``shared.core.room``)."""
    state, order = view.state, view.order
    assert state is not None and state.room is not None and order is not None
    return JoinRoom(state.room, view.order_id, waiter_key(order.created_at, view.order_id),
                    ctx.config.lane_queue("SchedulerQueue", order.priority), ctx.config.customer_max_in_flight,
                    ctx.now, view.traceparent)


def replay_room(view: View, holds: str | None, ctx: Ctx) -> list[Effect]:
    """A replayed submission that took a slot at the door (``holds``: the room) for an order that
    exists already: given back unless the order runs in that room (it held it already), or waits
    there (its join, in ``plan_replay`` or the Supervisor's, finds it a holder and admits it). An
    order waiting in another room (its key reused with another customer's body) gives it back."""
    state = view.state
    if holds is None or state is None or (state.waits_for_room and state.room == holds):
        return []
    if state.room == holds and category_of(state) is Category.IN_FLIGHT:
        return []
    # Crash before this: a slot held by an order not in the room; the room's watch frees it.
    return [LeaveRoom(holds, view.order_id, None, ctx.now)]


def admitted(view: View, ctx: Ctx) -> Decision:
    """Its admission: the order holds a slot in its customer's room now (whoever gave it one wrote
    that first), and starts: its first step dispatched, as the submission of an order under the cap
    does, with a deadline row of its own first (it had none while it waited)."""
    state = view.state
    assert state is not None
    step = view.step_at(state.step_index)
    if step is None:
        return Decision(Verdict.INCONSISTENT, [log(logging.ERROR, "schedule.inconsistent", view, seq=ROOM_SEQ)])
    claimed = replace(state, process_state=ProcessState.PROCESSING, locked_by=ctx.instance_id, claim_token=ctx.token,
                      claimed_seq=ROOM_SEQ, waiting_room=False)
    rows, new_state = dispatch(view, step, claimed, ctx)
    assert new_state.complete_by is not None
    index = cover(view.order_id, new_state.complete_by, ctx, note="admitted order deadline")
    new_state = replace(new_state, index_due=index.due)
    after = view.with_steps(*rows).with_state(new_state)
    return Decision(Verdict.CLAIMED, [
        # Crash after this: nothing changed; the admission is redelivered and puts it again.
        index,
        # The claim and the first step Running, ONE transaction (ETag). Lost race: a copy of the
        # admission claimed it first. Crash after this (request not sent): the redelivered
        # admission (seq == ClaimedSeq) re-sends it; otherwise the Supervisor redrives at CompleteBy.
        commit(view, new_state, view.replacing(rows),
               [event(EventKind.ADMITTED, room=state.room), *(dispatched(r) for r in rows)], ctx,
               note="admitted: claim"),
        *(send for r in rows for send in step_sends(after, r, ctx)),
        *status_sends(view, "admitted", ctx, processState=ProcessState.PROCESSING),
        info("order.admitted", view, step=new_state.step_name, room=state.room, completeBy=new_state.complete_by),
    ])
