"""An order as the peers' steps send it (standard library only: the Temporal peer shares it)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any


class BadOrder(ValueError):
    pass


def normalise(raw: Any) -> dict[str, Any]:
    """The order as the steps send it: items with str prices, and ``total`` as our app sums it."""
    if not isinstance(raw, dict) or not isinstance(raw.get("items"), list) or not raw["items"]:
        raise BadOrder("an order needs a non-empty items list")
    items, total = [], Decimal(0)
    try:
        for item in raw["items"]:
            price, qty = Decimal(str(item["unitPrice"])), int(item["quantity"])
            items.append({"sku": str(item["sku"]), "quantity": qty, "unitPrice": str(price)})
            total += price * qty
    except (KeyError, TypeError, ValueError, InvalidOperation) as e:
        raise BadOrder(f"bad item: {e!r}") from None
    return {"customerId": str(raw.get("customerId", "")), "currency": str(raw.get("currency", "EUR")),
            "items": items, "total": str(total)}
