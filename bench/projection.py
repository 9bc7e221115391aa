"""The Azure projection: orders/s one Service Bus Standard namespace and one storage account carry,
from the operations counted per order (``bench.report.per_order``, over the saturation window
when there is one: the rate a projection is about).

Assumptions, stated in ``bench.json`` with each figure:

* Service Bus Standard: ~1,000 operations/s per namespace (its throttling credits); counted: the
  sends to every queue the app sends to, and the deliveries, settlements and management
  operations of the work queues (the bench's own status-queue receives excluded).
* Storage account: 20,000 transactions/s (1 KiB entities). Whether an entity-group transaction
  counts once or once per entity toward that target, both figures are given; the binding limit
  takes the lower (every entity counted, reads' returned entities included).
* One table partition: 2,000 entities/s: the deadline index's due-minute partition and the
  search index's single partition are shared by every order in flight.
"""

from __future__ import annotations

from typing import Any

SB_STANDARD_OPS = 1000
ACCOUNT_TRANSACTIONS = 20000
PARTITION_ENTITIES = 2000


def projection(po: dict[str, Any] | None, counted_over: str = "load phases") -> dict[str, Any] | None:
    if po is None:
        return None
    out: dict[str, Any] = {}
    if "bus" in po and po["bus"]["azure_ops_per_order"]:
        ops = po["bus"]["azure_ops_per_order"]
        out["service_bus_standard_namespace"] = {
            "ops_per_s": SB_STANDARD_OPS, "ops_per_order": ops, "orders_per_s": round(SB_STANDARD_OPS / ops, 1),
            "counted": "sends (all queues the app sends to) + deliveries + settlements + management ops "
                       "of the work queues; the bench's own status-queue receives excluded"}
    t = po["table"]
    ent, req = t["entities_per_order"], t["requests_per_order"]
    if ent:
        out["storage_account"] = {
            "transactions_per_s": ACCOUNT_TRANSACTIONS, "entities_per_order": ent, "requests_per_order": req,
            "orders_per_s": round(ACCOUNT_TRANSACTIONS / max(ent, req), 1),
            "orders_per_s_if_a_batch_counts_once": round(ACCOUNT_TRANSACTIONS / req, 1) if req else None,
            "counted": "every entity a request writes or returns counted as one transaction (the lower "
                       "figure); the other counts each request (an entity-group transaction) once"}
    for name, key, why in (
            ("deadline_index_partition", "index_entities_per_order",
             "every deadline index row of a minute lands in one partition (the due minute), so all "
             "orders in flight share it; the order's own partition sees far less"),
            ("search_index_partition", "search_index_entities_per_order",
             "the search index is ONE partition (orders): every order's index writes (when it is "
             "accepted and when it ends) land there")):
        per_order = t.get(key)
        if per_order:
            out[name] = {"entities_per_s": PARTITION_ENTITIES, key: per_order,
                         "orders_per_s": round(PARTITION_ENTITIES / per_order, 1), "why": why}
    limits = [v["orders_per_s"] for v in out.values()]
    if limits:
        out["binding_limit_orders_per_s"] = min(limits)
    out["counted_over"] = counted_over
    return out
