"""The order state machine, as pure functions: (rows of one order, event, now) -> effects.

Nothing here does I/O. Each ``decide_*`` function reads the order's rows (a :class:`View` of
its partition, typed rows with their ETags) and returns a :class:`Decision`: a verdict (for
logs and tests) and the ordered effects to run (``shared.core.effects``). Every state write is an
ETag-conditioned transaction; every index row is written before the state write that creates
the deadline it guards. Next to each effect, a comment names the crash point it is safe
against: what a crash right AFTER that effect leaves, and who completes it.

It decides over the core's typed rows (``shared.core.rows``: order, state, step, history,
index rows; ``shared.core.states``: their enums; ``shared.core.lease``: what is in flight).
By concern:

===============  ==========================================================================
``view``         one order's partition (``View``)
``config``       ``Config`` (settings, workflow), ``Ctx`` (now, instance)
``verdicts``     ``Decision`` (a verdict and its effects), ``Verdict``, ``Rejected``
``binding``      each order runs its own workflow (name, version); an order whose version is gone is held
``outbox``       the other messages a decision sends: schedule notices, status messages, alerts, logs
``deadlines``    the deadline index, and the hand-off of an order to a scheduler, later
``dispatch``     dispatching a step or compensation, in one place: its rows in flight, its history
                 event, what it sends (the agent's request, a wake-up); what is in flight now
``forward``      the submission, a scheduler's claim, a step's reply
``failure``      a step that failed for good: hold, fail, compensate now or later
``compensation`` a compensation's reply, and what follows a compensation
``expiry``       the Supervisor's moves on an overdue order
``history``      the order's history events, written in the transaction they record
``search_index`` the search index rows of an order, and when they are written
``operator``     retry (from any failure) and cancel
``terminate``    terminate an order in flight
``suspend``      suspend an order running its steps (no new step dispatched), and resume it
``actions``      the operator actions by name, and which ones an order takes now
``waiting``      a step waiting on a remote's open circuit breaker, and its resumes
===============  ==========================================================================

States (state row):

=============  =========  ===================  ===========================================
ProcessState   Mode       lease                meaning
=============  =========  ===================  ===========================================
Pending        forward    unclaimed            redriven or retried; waits for a claim
Pending        forward    unclaimed            ``WaitingRoom``: over its customer's CustomerMaxInFlight,
                                               waits for a slot (``shared.core.room``), no deadline
Processing     forward    STEP:N               step dispatched (attempt N), claim held; a
                                               new order starts here
Pending        forward    none                 suspended by an operator, nothing in flight
Processed      finished   none                 all steps done
Error          held       none                 a step failed for good, ``hold``: operator
Error          compensate unclaimed            compensation to dispatch
Error          compensate STEP:compensate:N    compensation in flight, claim held
Error          finished   none                 failed, cancelled or terminated;
                                               compensations ended
=============  =========  ===================  ===========================================

Fencing: a reply is applied only if the state row's lease is exactly its step and attempt,
the claim is held (LockedBy) and the step row agrees. The ETag condition on the transaction
serialises it against a concurrent supervisor/scheduler: whichever writes first wins and the
other loses its race. A reply for a step already recorded Done/Failed with the same attempt is
a duplicate: it changes nothing, but re-emits the request currently in flight (same
message_id, so duplicate detection drops it if the first send got through). That is how a
crash between a state write and the following send is resumed.

Unknown outcomes: a step that failed by timeout (no answer) may have had its effect applied.
Its step row says ``OutcomeUnknown``. Under ``compensate`` it is compensated first, then the
Done steps in reverse order; an operator cancel does the same. Its compensation request
carries no result in ``context``: it names the effect by the step's idempotency key
(``compensates``), and a remote that applied nothing under that key tombstones it, so a late
original request is refused. An error reply is definitive: the failed step is not compensated.

Waiting on a breaker (``waiting``): an agent whose remote's circuit breaker is open replies
``waiting`` instead of calling. The lease, the attempt and FailureCount stay; the step row says
``WaitingOn``. Probes send the same attempt again and write nothing; the close ends the wait
(``decide_resume``); past ``BreakerMaxWaitSeconds`` the step fails for good (``expiry``).

Steps that wait (``events``): a ``wait`` step ends with its external event (``decide_event``) or
its timeout; a ``delay`` with its timer, a scheduled wake-up message (``decide_wake``). Neither
calls an agent; the Supervisor ends either one past its CompleteBy.
"""

from shared.core.lease import Lease, LeaseKind
from shared.core.rows import EventRow, IndexRow, OrderRow, StateRow, StepRow
from shared.core.statemachine.binding import bound, decide_for_order
from shared.core.statemachine.config import Config, Ctx
from shared.core.statemachine.deadlines import ORPHAN_INDEX_AGE, IndexVerdict, index_verdict
from shared.core.statemachine.dispatch import inflight_requests, request_not_in_flight
from shared.core.statemachine.events import BadEvent, decide_event, decide_wake, event_key
from shared.core.statemachine.expiry import decide_expired
from shared.core.statemachine.forward import decide_reply, decide_schedule, plan_replay, plan_submission
from shared.core.statemachine.history import EventKind
from shared.core.statemachine.operator import decide_cancel, decide_retry
from shared.core.statemachine.outbox import schedule_message
from shared.core.statemachine.search_index import category_of, index_rows
from shared.core.statemachine.terminate import decide_terminate
from shared.core.statemachine.verdicts import KEEP_TELEMETRY, OPERATOR_RESULTS, Decision, Rejected, Verdict
from shared.core.statemachine.view import View
from shared.core.statemachine.waiting import decide_resume
from shared.core.states import Category, CompensationState, Mode, OrderCompensation, Outcome, ProcessState, StepState

__all__ = [
    "BadEvent", "decide_event", "decide_wake", "event_key",
    "bound", "Category", "category_of", "CompensationState", "Config", "Ctx", "decide_cancel", "decide_expired",
    "decide_for_order", "decide_reply", "decide_resume", "decide_retry", "decide_schedule", "decide_terminate",
    "Decision", "EventKind", "EventRow", "index_rows", "index_verdict", "IndexRow", "IndexVerdict",
    "inflight_requests", "KEEP_TELEMETRY", "Lease", "LeaseKind", "Mode", "OPERATOR_RESULTS", "OrderCompensation",
    "OrderRow",
    "ORPHAN_INDEX_AGE", "Outcome", "plan_replay", "plan_submission", "ProcessState", "Rejected",
    "request_not_in_flight",
    "schedule_message", "StateRow",
    "StepRow", "StepState", "Verdict", "View",
]
