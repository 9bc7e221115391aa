"""The Azure projection: orders/s one Service Bus Standard namespace and one storage account carry,
from the operations counted per order (``bench.report.per_order``, over the saturation window
when there is one: the rate a projection is about).

Assumptions, stated in ``bench.json`` with each figure:

* Service Bus Standard: 1,000 credits/s per namespace, priced by Azure's rules ("Service Bus
  throttling", learn.microsoft.com/azure/service-bus-messaging/service-bus-throttling): Send,
  Receive, Peek 1 credit per message, entity Create/Read/Update/Delete 10, settlement not listed
  (``bench.cost.bus_credits``): every message sent, every delivery on the work queues; the status
  queue's receives are its consumer's (the order's caller), given apart.
* Service Bus Premium: throttled by the messaging units' CPU and memory, not by credits; the docs
  give no operations/s per MU. Assumed: at least Standard's 1,000 per second per MU (the premium
  page: "peak performance is much faster than with the Standard tier"), linear in MUs ("a single
  workload or entity can span multiple messaging units"). A floor to replace by a measurement.
* Storage account: 20,000 transactions/s (1 KiB entities). Whether an entity-group transaction
  counts once or once per entity toward that target, both figures are given; the binding limit
  takes the lower (every entity counted, reads' returned entities included).
* One table partition: 2,000 entities/s. The deadline index's partitions of the due minute
  (``DEADLINE_SHARDS``) and the search index's shards (``SEARCH_SHARDS``) are shared by every order
  in flight: their ceilings are that many partitions', the writes spread by a hash of the order id.
"""

from __future__ import annotations

from typing import Any

from shared.core.effects import DEADLINE_SHARDS
from shared.storage.store import SEARCH_SHARDS

SB_STANDARD_CREDITS = 1000
SB_PREMIUM_PER_MU_ASSUMED = 1000  # not documented: see above
PREMIUM_MUS = (1, 2, 4)
ACCOUNT_TRANSACTIONS = 20000
PARTITION_ENTITIES = 2000


def projection(po: dict[str, Any] | None, counted_over: str = "load phases") -> dict[str, Any] | None:
    if po is None:
        return None
    out: dict[str, Any] = {}
    credits = (po.get("bus") or {}).get("credits") or {}
    if credits.get("credits_per_order"):
        c, with_status = credits["credits_per_order"], credits["with_status_consumer"]
        out["service_bus_standard_namespace"] = {
            "credits_per_s": SB_STANDARD_CREDITS, "credits_per_order": c,
            "orders_per_s": round(SB_STANDARD_CREDITS / c, 1),
            "orders_per_s_with_status_consumer": round(SB_STANDARD_CREDITS / with_status, 1),
            "credits_per_order_by_rule": credits["by_rule_per_order"],
            "ops_per_order_before_credits": po["bus"]["azure_ops_per_order"],
            "counted": credits["rules"]}
        out["service_bus_premium"] = {
            f"{mu}_mu": {"orders_per_s_at_least": round(mu * SB_PREMIUM_PER_MU_ASSUMED / c, 1),
                         "with_status_consumer": round(mu * SB_PREMIUM_PER_MU_ASSUMED / with_status, 1)}
            for mu in PREMIUM_MUS} | {
            "assumed": f">= {SB_PREMIUM_PER_MU_ASSUMED} credit-equivalents/s per messaging unit, linear "
                       "(not documented: Premium is throttled by its MUs' CPU and memory)"}
    t = po["table"]
    ent, req = t["entities_per_order"], t["requests_per_order"]
    if ent:
        out["storage_account"] = {
            "transactions_per_s": ACCOUNT_TRANSACTIONS, "entities_per_order": ent, "requests_per_order": req,
            "orders_per_s": round(ACCOUNT_TRANSACTIONS / max(ent, req), 1),
            "orders_per_s_if_a_batch_counts_once": round(ACCOUNT_TRANSACTIONS / req, 1) if req else None,
            "counted": "every entity a request writes or returns counted as one transaction (the lower "
                       "figure); the other counts each request (an entity-group transaction) once"}
    for name, key, partitions, why in (
            ("deadline_index_partition", "index_entities_per_order", DEADLINE_SHARDS,
             f"an order's deadline index rows of a minute land in one of that minute's {DEADLINE_SHARDS} "
             "partitions (a hash of its id, shared.core.effects.order_bucket), shared by every order in "
             "flight; the order's own partition sees far less"),
            ("search_index_partition", "search_index_entities_per_order", SEARCH_SHARDS,
             f"the search index is {SEARCH_SHARDS} partitions (orders-0 .. orders-{SEARCH_SHARDS - 1}, by a hash "
             "of the order id, shared.storage.store.SEARCH_SHARDS): every order's index writes (when it is "
             "accepted and when it ends) land in its shard")):
        per_order = t.get(key)
        if per_order:
            out[name] = {"entities_per_s": PARTITION_ENTITIES * partitions, "partitions": partitions, key: per_order,
                         "orders_per_s": round(PARTITION_ENTITIES * partitions / per_order, 1), "why": why}
    limits = [v["orders_per_s"] for v in out.values() if "orders_per_s" in v]  # Premium: an alternative tier
    if limits:
        out["binding_limit_orders_per_s"] = min(limits)
    out["counted_over"] = counted_over
    return out


def service_bus_line(proj: dict[str, Any]) -> str:
    sb, prem = proj["service_bus_standard_namespace"], proj["service_bus_premium"]
    mus = ", ".join(f"{k.replace('_', ' ')} {v['orders_per_s_at_least']}"
                    for k, v in prem.items() if isinstance(v, dict))
    return (f"Service Bus by credits: {sb['credits_per_order']} per order {sb['credits_per_order_by_rule']}: Standard "
            f"{sb['orders_per_s']} orders/s ({sb['orders_per_s_with_status_consumer']} with the status consumer's "
            f"receives); Premium at least {mus} ({prem['assumed']})")

