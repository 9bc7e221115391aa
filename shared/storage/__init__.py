"""Storage: the store protocol (``store``) over Table Storage (``table_store``, through ``tables``:
the REST path or the SDK's) or in memory (``memory``), the circuit breakers' rows (``breakers``),
the rows of steps waiting on a breaker (``waiting``) and the fencing tokens (``fence``)."""
