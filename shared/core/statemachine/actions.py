"""The operator's actions on an order, by name, and which of them the order takes now.

``allowed_actions`` asks each action's own decision (``operator``: retry, cancel; ``terminate``;
``suspend``: suspend, resume)
and keeps those that are not refused: the API shows the list with the order, and the console
offers exactly those, so no second copy of the rules exists anywhere.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.core.statemachine.config import Ctx
from shared.core.statemachine.operator import decide_cancel, decide_retry
from shared.core.statemachine.suspend import decide_suspend, decide_unsuspend
from shared.core.statemachine.terminate import decide_terminate
from shared.core.statemachine.verdicts import Decision, Rejected
from shared.core.statemachine.view import View

ACTIONS: dict[str, Callable[[View, Ctx], Decision]] = {
    "retry": decide_retry, "cancel": decide_cancel, "terminate": decide_terminate, "suspend": decide_suspend,
    "resume": decide_unsuspend}


def allowed_actions(view: View, ctx: Ctx) -> list[str]:
    """The actions whose decision on ``view`` is not refused (the API would not answer 409),
    in the order of ``ACTIONS``. The decisions are pure: nothing is written or sent."""
    allowed = []
    for name, decide in ACTIONS.items():
        try:
            decide(view, ctx)
        except Rejected:
            continue
        allowed.append(name)
    return allowed
