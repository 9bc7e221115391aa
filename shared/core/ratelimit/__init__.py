"""A remote's rate limit, shared by every instance, as pure decisions (docs/breaker-design.md, §7).

The limit of a remote is ``perSecond`` calls with a ``burst``: declared per agent in
``workflows/agents.json`` (``rateLimit: {perSecond, burst}``) and overridden by the app setting
``RemoteRateLimits`` (``payment=8/s,shipping=20/s``; ``payment=off`` drops a declared limit).

The shared state is ONE row per limited remote (state table, partition ``ratelimits``, RowKey =
the agent's name, every write ETag-conditioned, like a breaker's): the generic cell rate
algorithm's theoretical arrival time ``Tat``, and ``PausedUntil``, the end of the last
``Retry-After`` a remote answered with a 429. A call takes the next free slot:

* ``slot = max(now, Tat - tolerance, PausedUntil)``, ``Tat' = max(Tat, now, PausedUntil) + interval``,
  ``interval = 1.05 / perSecond`` (5% under the rate told), ``tolerance = (burst - 1) * interval``
  (``burst`` calls may go at once after a quiet spell);
* the slot is now -> ``call``; within ``hold`` (and the step's time) -> ``sleep`` until it, then
  call; later -> ``wait``: the slot is RESERVED in the row and the step waits as it does on an
  open breaker (a ``waiting`` reply that claims the wake-up ``WAKE_LEAD`` before the slot). The
  request the wake-up sends again is named after that time (``probe-{until}``,
  ``shared.core.breaker.waiting.probe_tag``): :func:`bucket.reserved_slot` reads the slot back
  from it, and the agent sleeps until the slot and calls in it without taking another.

Nothing here does I/O (like ``shared.core.statemachine``): each ``decide_*`` returns a
:class:`RateDecision`, the row to write (``None``: write nothing) and the effect to run ONLY once
that write has won; each effect says what a crash right before or after it leaves behind.

The limits (declared, overridden by the setting) are ``shared.core.workflows.ratelimits``; ``bucket``:
the shared row and the decisions on it.
"""
