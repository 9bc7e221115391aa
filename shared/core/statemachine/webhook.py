"""The webhook an ending tells (``shared.core.webhooks``): what every decision that ends an order
adds to its effects. Nothing when ``WebhookUrl`` is not set (no row, no message: no cost).

An ending is a commit whose new state is finished (Processed; failed, cancelled or terminated,
its compensations ended) or held for an operator. Each such decision weaves in ``Told``:

* ``cover`` BEFORE its transaction: the delivery's watch. Crash after it: the ending did not
  commit; the watch falls due, finds no delivery row and goes.
* ``ops`` IN its transaction: the delivery row (try 1 due now). Crash after the commit: the
  order ended and its delivery is recorded; the watch falls due and sends try 1.
* ``sends`` after it: the message for try 1 (not critical: the watch covers it, and the order's
  processing never waits on a webhook).

A decision re-run on the same view (a redelivered reply whose first run crashed before the commit)
writes the same row key (``seq``, the first history event of the transaction); one that lost its
race wrote nothing but its watch. The event's ``type``: ``order.processed``; ``order.failed`` (a
step failed for good, compensated or not); ``order.held``; ``order.terminated`` (terminated or
cancelled by an operator; ``data.outcome`` says which).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.core.effects import Effect, PutWatch, Send
from shared.core.jsonio import dumps, present
from shared.core.rows import Op, StateRow
from shared.core.statemachine.config import Ctx
from shared.core.statemachine.view import View
from shared.core.states import Mode, Outcome
from shared.core.times import iso
from shared.core.webhooks import HookWatch, delivery_message, new_hook


@dataclass(frozen=True)
class Told:
    cover: list[Effect] = field(default_factory=list)
    ops: tuple[Op, ...] = ()
    sends: list[Effect] = field(default_factory=list)


def event_type(state: StateRow) -> str | None:
    """The webhook type of an order in ``state``, or None when it has not ended."""
    if state.mode is Mode.HELD:
        return "order.held"
    if state.mode is not Mode.FINISHED:
        return None
    if state.outcome is Outcome.PROCESSED:
        return "order.processed"
    if state.outcome in (Outcome.TERMINATED, Outcome.CANCELLED):
        return "order.terminated"
    return "order.failed"


def tell(view: View, new_state: StateRow, ctx: Ctx) -> Told:
    """What the decision committing ``new_state`` over ``view`` adds (module docstring)."""
    kind = event_type(new_state)
    old = view.state
    if not ctx.config.webhooks or kind is None or old is None:
        return Told()
    if old.mode is Mode.FINISHED:  # already ended (a failed order cancelled): told when it ended
        return Told()
    order_id = view.order_id
    seq = old.event_seq + 1  # the first event the ending's transaction writes (``history.commit``)
    order = view.order
    data = present({"orderId": order_id, "customerId": order.customer_id if order is not None else None,
                    "processState": str(new_state.process_state), "outcome": str(new_state.outcome or "") or None,
                    "compensation": str(new_state.compensation_state) if new_state.compensation_state else None,
                    "failedStep": new_state.failed_step, "reason": new_state.reason,
                    "workflow": order.workflow if order is not None else None})
    body = dumps({"type": kind, "timestamp": iso(ctx.now), "data": data})
    hook = new_hook(order_id, seq, kind, body, ctx.now)
    assert hook.cover_at is not None
    watch = HookWatch(order_id, hook.key, hook.cover_at)
    queue = ctx.config.queues["WebhooksQueue"]
    return Told(cover=[PutWatch(watch.row, note=f"webhook {kind}")], ops=(hook.create(),),
                sends=[Send(delivery_message(queue, order_id, hook), critical=False, what=f"webhook {kind}")])
