"""Storage: the store protocol (``store``) over Table Storage (``table_store``, through ``tables``:
the REST path or the SDK's) or in memory (``memory``), the circuit breakers' rows (``breakers``),
and the rows of steps waiting on a breaker (``waiting``); where a handler's view of an order comes
from (``views``: a read, or the rows of a fencing token, ``shared.core.fence``)."""
