"""The public order contract (pydantic v2): an order as ``POST /api/orders`` takes it, its ids,
currencies and limits.

Money is ``Decimal`` end to end: JSON is parsed with ``parse_float=Decimal`` (``shared.core.jsonio``)
and amounts are written back as strings; a float never holds an amount. Currencies come from the
ISO 4217 list kept by the ``iso4217`` package (the maintenance agency's table, with its publication date).
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

import iso4217
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator

# ---------------------------------------------------------------------------------------------
# Limits of the public contract
MAX_ITEMS = 100
MAX_QUANTITY = 10_000
MAX_UNIT_PRICE = Decimal("1000000")
MAX_PRICE_PLACES = 4
MAX_ID_LENGTH = 64
MAX_IDEMPOTENCY_KEY_LENGTH = 200

# Safe identifiers: letters, digits and . _ - : @ (never / \ # ? or control characters, which
# would break Table keys, URLs and logs).
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")
# Service Bus queue names: letters, digits, . _ - (we do not accept hierarchical '/').
QUEUE_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,258}[A-Za-z0-9])?$")
WORKFLOW_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")  # as shared.core.workflows.schema names them
DEFAULT_WORKFLOW = "order"  # shared.core.workflows.DEFAULT_WORKFLOW
# An order id as stored and returned: 32 lower-case hex digits (uuid.hex). The API also takes the
# canonical UUID text form (8-4-4-4-12 hex digits with dashes, any case: RFC 9562 reads UUIDs
# case-insensitively) and maps it to this one.
ORDER_ID = re.compile(r"^[0-9a-f]{32}$")
ORDER_ID_UUID_FORM = re.compile(r"^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$")
ORDER_ID_EXAMPLE = "0f8fad5bd9cb469fa16570867728950e"
ORDER_ID_FORMS = (f"32 lower-case hex digits ({ORDER_ID_EXAMPLE}) or a UUID with dashes, any case "
                  f"({uuid.UUID(ORDER_ID_EXAMPLE)})")
IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces

# Namespace of order ids derived from Idempotency-Key headers (uuid5): stable across workers.
IDEMPOTENCY_NAMESPACE = uuid.UUID("6f1e1c3a-64a8-4d0e-9a51-2b7c5c0f5a11")


def new_order_id() -> str:
    return uuid.uuid4().hex


def order_id_for_key(key: str) -> str:
    return uuid.uuid5(IDEMPOTENCY_NAMESPACE, key).hex


def parse_order_id(value: str | None) -> str | None:
    """The stored form of an order id given in either API form (``ORDER_ID_FORMS``), else None."""
    if not value:
        return None
    if ORDER_ID.fullmatch(value):
        return value
    if ORDER_ID_UUID_FORM.fullmatch(value):
        return value.replace("-", "").lower()
    return None


# ---------------------------------------------------------------------------------------------
# Currencies: ISO 4217 codes an amount can be paid in, i.e. those with a minor unit. The codes
# without one (gold, silver, platinum, palladium, the bond-market units, XDR, XSU, XUA, and XTS
# "testing" and XXX "no currency") are ISO 4217 codes but not money an order is paid in.
ISO4217_PUBLISHED = iso4217.__published__.isoformat()
ISO4217_CODES = frozenset(c.code for c in iso4217.Currency)
CURRENCIES = frozenset(c.code for c in iso4217.Currency if c.exponent is not None)
_CURRENCY_EXPECTED = (f"one of the ISO 4217 codes (list of {ISO4217_PUBLISHED}; lower case is accepted and "
                      f"upper-cased): {', '.join(sorted(CURRENCIES))}")


def currency_code(value: str) -> str:
    """``value`` as an upper-case code from ``CURRENCIES``; a ValueError listing them otherwise."""
    code = value.upper() if value.isascii() else value  # ASCII first: "ınr".upper() == "INR"
    if code in CURRENCIES:
        return code
    if code in ISO4217_CODES:
        raise ValueError(f"{code} has no minor unit: it is not a currency an order is paid in; "
                         f"must be {_CURRENCY_EXPECTED}")
    raise ValueError(f"must be {_CURRENCY_EXPECTED}")


# ---------------------------------------------------------------------------------------------
# The public order contract


def _safe_id(value: str) -> str:
    if not SAFE_ID.fullmatch(value):
        raise ValueError("must start with a letter or digit and contain only letters, digits and . _ - : @")
    return value


class OrderItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sku: Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)]
    quantity: Annotated[StrictInt, Field(ge=1, le=MAX_QUANTITY)]
    unitPrice: Decimal  # noqa: N815 (public camelCase contract)

    @field_validator("sku")
    @classmethod
    def _sku(cls, v: str) -> str:
        return _safe_id(v)

    @field_validator("unitPrice", mode="before")
    @classmethod
    def _price(cls, v: Any) -> Decimal:
        if isinstance(v, bool) or isinstance(v, float):
            # floats never reach here from our parser; a float would already have lost precision
            raise ValueError("must be a decimal number")
        if isinstance(v, int):
            v = Decimal(v)
        elif isinstance(v, str):
            if not re.fullmatch(r"[0-9]{1,7}(\.[0-9]{1,8})?", v):
                raise ValueError("must be a decimal number")
            try:
                v = Decimal(v)
            except InvalidOperation as exc:  # pragma: no cover (regex guards)
                raise ValueError("must be a decimal number") from exc
        if not isinstance(v, Decimal):
            raise ValueError("must be a decimal number")
        if not v.is_finite():
            raise ValueError("must be a finite decimal number")
        if v < 0:
            raise ValueError("must not be negative")
        if v > MAX_UNIT_PRICE:
            raise ValueError(f"must not exceed {MAX_UNIT_PRICE}")
        exponent = v.as_tuple().exponent
        if isinstance(exponent, int) and exponent < -MAX_PRICE_PLACES:
            q = v.quantize(Decimal(1).scaleb(-MAX_PRICE_PLACES))
            if q != v:  # 9.990000 is fine, 9.99001 is not
                raise ValueError(f"must have at most {MAX_PRICE_PLACES} decimal places")
            v = q
        return Decimal(format(v, "f"))  # fixed point: 1E+2 -> 100


class OrderRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    customerId: Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)]  # noqa: N815
    currency: str
    items: Annotated[list[OrderItem], Field(min_length=1, max_length=MAX_ITEMS)]
    priority: Literal["low", "normal", "high"] | None = "normal"
    statusQueue: str | None = None  # noqa: N815
    workflow: str | None = None  # a loaded workflow's name (checked by the submission); None: "order"

    @field_validator("customerId")
    @classmethod
    def _customer(cls, v: str) -> str:
        return _safe_id(v)

    @field_validator("currency")
    @classmethod
    def _currency(cls, v: str) -> str:
        return currency_code(v)

    @field_validator("statusQueue")
    @classmethod
    def _queue(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if not QUEUE_NAME.fullmatch(v):
            raise ValueError("must be a queue name: letters, digits, '.', '_', '-' (at most 260)")
        return v

    @field_validator("workflow")
    @classmethod
    def _workflow(cls, v: str | None) -> str | None:
        if v is not None and not WORKFLOW_NAME.fullmatch(v):
            raise ValueError("must be a workflow name: lower-case letters, digits and '-' (at most 63)")
        return v

    @property
    def workflow_name(self) -> str:
        return self.workflow or DEFAULT_WORKFLOW

    @property
    def effective_priority(self) -> str:
        return self.priority or "normal"

    @property
    def total(self) -> Decimal:
        return sum((i.unitPrice * i.quantity for i in self.items), Decimal(0))

    def canonical(self) -> dict[str, Any]:
        """The normalised order: what the body hash covers and what is stored. The workflow is
        in it only when it is not the default, so an order's hash is what it was before orders
        named one."""
        out: dict[str, Any] = {
            "customerId": self.customerId,
            "currency": self.currency,
            "items": [{"sku": i.sku, "quantity": i.quantity, "unitPrice": str(i.unitPrice)} for i in self.items],
            "priority": self.effective_priority,
            "statusQueue": self.statusQueue,
        }
        if self.workflow_name != DEFAULT_WORKFLOW:
            out["workflow"] = self.workflow_name
        return out

    def body_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.canonical(), sort_keys=True).encode()).hexdigest()


def error_field(loc: tuple[Any, ...]) -> str:
    """pydantic loc -> 'items[0].quantity'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(body)"


def validation_errors(exc: ValidationError) -> list[dict[str, str]]:
    errors = []
    for e in exc.errors(include_url=False):
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        errors.append({"field": error_field(loc), "message": msg})
    return errors


