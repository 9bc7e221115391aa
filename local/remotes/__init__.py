"""Remote services simulator: the inventory, payment, shipping and delivery HTTP services the agents call.

One threaded HTTP server serves the four services under ``/inventory``, ``/payment``,
``/shipping`` and ``/delivery`` (docs/contracts.md, "Remote services"). It honours ``Idempotency-Key``, keeps a
ledger of every effect, and takes run-time fault injection per service through ``/_faults``.

Start it with ``python -m local.remotes --host 127.0.0.1 --port P [--seed N]``; drive it from
tests with :class:`local.remotes.client.RemotesClient`.
"""

from local.remotes.server import FAULT_DEFAULTS, SERVICES, RemotesServer, Simulator

__all__ = ["FAULT_DEFAULTS", "SERVICES", "RemotesServer", "Simulator"]
