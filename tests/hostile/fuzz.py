"""Generated requests against the app on the local host (schemathesis, from functions/openapi.yaml).

    python -m tests.hostile.fuzz --requests 10000 [--seed N] [--out bench/results/fuzz.json]

starts the local stack (Azurite, the Service Bus emulator, the remote services, the local
Functions host with the app), sends that many generated requests (positive and negative
cases of every operation; ids of accepted orders and used Idempotency-Keys are fed back in,
so GET/history/retry/cancel/terminate/events and key reuse reach real orders; most events are
the one order v2 waits for (``approval``, mostly approved, now and then declined), sent to an
accepted order of over 1000 if there is one (a quarter of the orders are priced over it), so
that they reach its wait and not only "waits for no such event"; the customer ids of
accepted orders are fed to searches, and the continuation tokens the app hands out are sent
back, unchanged or tampered with; query parameters are now and then replaced with hostile
values, tests/hostile/fuzz_queries.py; each request carries the key its operation takes in the
document, the function key or the master key, in the ``x-functions-key`` header, whatever key
header or ``code`` was generated: the host checks keys, and a request without its key would
get the host's 401, never reaching the app), stops the stack, then prints and writes:

* requests sent, counts by status and by operation;
* 5xx responses (must be 0);
* 4xx responses and how many are application/problem+json with a matching ``status``
  (must be all);
* schemathesis conformance failures against the document (status codes, content types,
  response schemas and headers: the document must describe the API as implemented);
* searches: every order a 200 returns matches its filters (customer, category, creation
  range) and comes newest first; a tampered continuation token never gets a 2xx;
* rows: the state table, deadline index and search index before and after; every new
  partition belongs to an accepted order (``rowsOfRejected`` must be 0), every accepted order
  has exactly its rows (besides its history events) and is in the search index, and its
  order row holds the body that was accepted (no 409 replay overwrote it).

tests/hostile/test_fuzz.py runs the same with FUZZ_REQUESTS (default 300) on its session stack.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import requests
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from local.host.keys import ADMIN, ANONYMOUS, FUNCTION, KEY_HEADER, HostKeys
from local.procs import REPO_ROOT
from shared.core.workflows import DEFAULT_WORKFLOW
from tests.hostile.fuzz_queries import (
    DEAD_LETTER_QUEUES,
    HOSTILE_QUERY_VALUES,
    QUERY_PARAMS,
    Tokens,
    search_violations,
    tamper,
)
from tests.hostile.stackutil import (
    PROBLEM,
    Tables,
    function_app_registers_openapi,
    is_history,
    rows_per_order,
    start_stack,
)

SPEC_PATH = REPO_ROOT / "functions" / "openapi.yaml"
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "fuzz.json"
SAMPLES = 20
# The events route, and the event (and its decision field) the default workflow's wait takes,
# from an order of over WAIT_OVER (workflows/order.v2.yaml).
EVENTS_PATH = "/orders/{id}/events/{name}"
AWAITED_EVENT = "approval"
AWAITED_DECISION = "approved"
WAIT_OVER = Decimal(1000)
# Tampering (fuzz_queries.tamper) whose result never encodes the same token: a 2xx for one is wrong.
STRICT_TAMPERING = (0, 1, 2, 3, 7)
# How long accepted orders may take to appear in the search index after the run (written after
# their state, group-committed).
INDEX_WAIT_SECONDS = 20.0


def rows_of(body: Any) -> int:
    """The rows (besides its history) of an order accepted with ``body``: by the workflow it
    names (``order`` v2 has a step more than ``digital``)."""
    name = body.get("workflow") if isinstance(body, dict) else None
    return rows_per_order(name if isinstance(name, str) else None)


def _waits(body: Any) -> bool:
    """Whether an order accepted with ``body`` waits for an approval (order v2, over 1000)."""
    if not isinstance(body, dict) or body.get("workflow") not in (None, "order"):
        return False
    try:
        total = sum(Decimal(str(i["quantity"])) * Decimal(str(i["unitPrice"])) for i in body["items"])
    except (KeyError, TypeError, ArithmeticError):
        return False
    return bool(total > WAIT_OVER)


@dataclass
class FuzzReport:
    requests: int = 0
    unsendable: int = 0  # generated requests the HTTP client refuses to send (e.g. \n in a header)
    transport_errors: int = 0  # connection reset / timeout instead of an answer
    by_status: Counter[int] = field(default_factory=Counter)
    by_operation: Counter[str] = field(default_factory=Counter)
    five_xx: list[dict[str, Any]] = field(default_factory=list)
    four_xx: int = 0
    problem_json: int = 0
    not_problem: list[dict[str, Any]] = field(default_factory=list)
    conformance: list[dict[str, Any]] = field(default_factory=list)
    conformance_failures: int = 0
    search_pages: int = 0
    search_orders: int = 0
    search_violations: list[dict[str, Any]] = field(default_factory=list)
    search_violation_count: int = 0
    tokens: Tokens = field(default_factory=Tokens)
    tokens_sent_back: int = 0
    tokens_tampered: int = 0
    tampered_accepted: list[dict[str, Any]] = field(default_factory=list)
    hostile_queries: Counter[int] = field(default_factory=Counter)  # status -> count
    # orderId -> first accepted body, in the order of acceptance: steering picks from it by index, never by
    # sorted id (most ids are random, uuid4: sorted, the same draw would pick another order every run).
    accepted: dict[str, dict[str, Any]] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)
    rows: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def waiting_orders(self) -> list[str]:
        """The accepted orders that wait for an approval (of the default workflow, over 1000),
        in the order of acceptance."""
        return [oid for oid, body in self.accepted.items() if _waits(body)]

    def sample(self, bucket: list[dict[str, Any]], item: dict[str, Any]) -> None:
        if len(bucket) < SAMPLES:
            bucket.append(item)

    def as_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "unsendableGenerated": self.unsendable,
            "byStatus": {str(k): v for k, v in sorted(self.by_status.items())},
            "byOperation": dict(sorted(self.by_operation.items())),
            "5xx": sum(v for k, v in self.by_status.items() if k >= 500),
            "transportErrors": self.transport_errors,
            "5xxSamples": self.five_xx,
            "problemJson": {"4xx": self.four_xx, "compliant": self.problem_json,
                            "nonCompliant": self.four_xx - self.problem_json, "samples": self.not_problem},
            "conformanceFailures": self.conformance_failures,
            "conformanceSamples": self.conformance,
            "search": {"pages": self.search_pages, "orders": self.search_orders,
                       "filterViolations": self.search_violation_count, "samples": self.search_violations},
            "continuationTokens": {"handedOut": len(self.tokens.seen), "sentBack": self.tokens_sent_back,
                                   "tampered": self.tokens_tampered,
                                   "tamperedAccepted": len(self.tampered_accepted),
                                   "tamperedAcceptedSamples": self.tampered_accepted},
            "hostileQueries": {str(k): v for k, v in sorted(self.hostile_queries.items())},
            "acceptedOrders": len(self.accepted),
            "rows": self.rows,
            "seed": self.seed,
            "seconds": round(self.seconds, 1),
        }

    def violations(self) -> list[str]:
        out = []
        j = self.as_json()
        if j["5xx"] or self.transport_errors:
            out.append(f"{j['5xx']} responses were 5xx and {self.transport_errors} requests got no answer: "
                       f"{self.five_xx[:5]}")
        if j["problemJson"]["nonCompliant"]:
            n = j["problemJson"]["nonCompliant"]
            out.append(f"{n} 4xx responses were not problem+json: {self.not_problem[:5]}")
        if self.conformance_failures:
            out.append(f"{self.conformance_failures} responses do not conform to openapi.yaml: {self.conformance[:5]}")
        rows = self.rows
        if rows.get("rowsOfRejected"):
            out.append(f"rows written for rejected requests: {rows.get('rejectedSamples')}")
        if rows.get("acceptedWithoutRows"):
            out.append(f"accepted orders without their rows: {rows.get('acceptedWithoutRowsSamples')}")
        if rows.get("ordersWithWrongRowCount"):
            out.append(f"orders with a wrong row count: {rows.get('wrongRowCountSamples')}")
        if rows.get("orderRowsChanged"):
            out.append(f"order rows not matching the accepted body: {rows.get('orderRowsChangedSamples')}")
        if rows.get("deadlineRowsOfRejected"):
            out.append(f"deadline rows of unknown orders: {rows.get('deadlineSamples')}")
        if rows.get("indexRowsOfRejected"):
            out.append(f"search index rows of unknown orders: {rows.get('indexSamples')}")
        if rows.get("acceptedNotIndexed"):
            out.append(f"accepted orders missing from the search index: {rows.get('notIndexedSamples')}")
        if self.search_violation_count:
            out.append(f"{self.search_violation_count} searches returned orders outside their filters: "
                       f"{self.search_violations[:5]}")
        if self.tampered_accepted:
            out.append(f"{len(self.tampered_accepted)} tampered continuation tokens were accepted: "
                       f"{self.tampered_accepted[:5]}")
        return out


def _schema(include_openapi: bool) -> Any:
    import schemathesis

    schema = schemathesis.openapi.from_path(str(SPEC_PATH))
    # A generated bulk operation would act on every order of the shared stack, the other hostile
    # tests' included, for minutes after the run: its hostile inputs are tests/hostile/test_operations.py.
    schema = schema.exclude(operation_id="startOperation")
    if not include_openapi:
        schema = schema.exclude(path="/openapi.yaml")
    return schema


# Requests per operation and generation mode in each round of the run, by operation (default 1):
# a strategy per operation run in turn, so that every operation gets its share (one_of over
# all of them leans heavily on a few).
ROUND_WEIGHTS = {("POST", "/orders"): 4, ("GET", "/orders"): 3, ("GET", "/orders/{id}/history"): 2,
                 ("POST", "/orders/{id}/events/{name}"): 2}
REQUESTS_PER_WEIGHT = 10


def _strategies(schema: Any, n: int) -> list[tuple[Any, int]]:
    """(strategy, requests per round) for each operation and generation mode; a run of ``n``
    requests shorter than a round still reaches every operation."""
    from schemathesis import GenerationMode

    parts = []
    ops = [result.ok() for result in schema.get_all_operations()]
    # Events right after the submissions whose orders they go to, before terminate and cancel end them;
    # searches after those, so that a run of one round has orders to find (the document lists
    # GET /orders before POST /orders).
    events = [op for op in ops if op.path == EVENTS_PATH]
    searches = [op for op in ops if (op.method.upper(), op.path) == ("GET", "/orders")]
    ops = [op for op in ops if op.path != EVENTS_PATH and op not in searches]
    at = next((i + 1 for i, op in enumerate(ops) if (op.method.upper(), op.path) == ("POST", "/orders")), len(ops))
    for op in ops[:at] + events + searches + ops[at:]:
        weight = ROUND_WEIGHTS.get((op.method.upper(), op.path), 1)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            parts.append((op.as_strategy(generation_mode=mode), weight))
    per_weight = min(REQUESTS_PER_WEIGHT, n / sum(w for _, w in parts))
    return [(strategy, max(1, round(w * per_weight))) for strategy, w in parts]


def _checks() -> list[Callable[..., Any]]:
    from schemathesis.checks import (
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    return [status_code_conformance, content_type_conformance, response_schema_conformance,
            response_headers_conformance]


def _header(resp: Any, name: str) -> str:
    """A response header from a schemathesis Response (header -> list of values)."""
    for k, v in resp.headers.items():
        if k.lower() == name:
            return v[0] if isinstance(v, list) and v else str(v)
    return ""


def _describe(case: Any, resp: Any = None) -> dict[str, Any]:
    body = None if type(case.body).__name__ == "NotSet" else case.body
    out: dict[str, Any] = {"method": case.method, "path": case.formatted_path,
                           "query": {k: str(v)[:120] for k, v in (case.query or {}).items()},
                           "headers": {k: v for k, v in (case.headers or {}).items()
                                       if k.lower() in ("content-type", "idempotency-key")},
                           "body": json.dumps(body, default=str)[:300] if body is not None else None}
    if resp is not None:
        out.update(status=resp.status_code, contentType=_header(resp, "content-type"),
                   response=resp.content[:300].decode("utf-8", "replace"))
    return out


@dataclass(frozen=True)
class Steer:
    """What one generated request gets from the run so far (known ids, used keys, customers
    and continuation tokens) or from HOSTILE_QUERY_VALUES. Every draw is made whatever the
    run's state: a draw that depends on external state makes hypothesis see one prefix draw
    two ways."""

    use_known: bool
    known_index: int
    reuse_key: bool
    key_index: int
    token_mode: int  # 0: send back one of its own; 1: one tampered with; 2: any as it was; else none
    token_index: int
    tamper_how: int
    known_customer: bool
    customer_index: int
    plain: bool  # a query that finds orders whatever the timing: no generated token, dates, failed step (mostly
    # junk) or state (an order's category changes as it runs); the customer and workflow of an accepted order
    small_limit: int  # 1..3 (a page that ends in a continuation token), or 0: the generated limit
    hostile: bool
    hostile_param: int
    hostile_value: int
    big_order: bool  # an order's first item priced so that the order waits for an approval
    awaited_event: bool  # an event: the one order v2 waits for (a generated name is almost never one)
    decision: int  # 0, 1: true, 2: false, else the generated body's (a wait's decision field)

    @staticmethod
    def draw(data: st.DataObject) -> Steer:
        big = st.integers(0, 2**31)
        return Steer(use_known=data.draw(st.integers(0, 1), label="known id") == 0,
                     known_index=data.draw(big, label="id"),
                     reuse_key=data.draw(st.integers(0, 5), label="reuse key") == 0,
                     key_index=data.draw(big, label="key"),
                     token_mode=data.draw(st.integers(0, 5), label="token mode"),
                     token_index=data.draw(big, label="token"),
                     tamper_how=data.draw(st.integers(0, 7), label="tamper"),
                     known_customer=data.draw(st.integers(0, 1), label="known customer") == 0,
                     customer_index=data.draw(big, label="customer"),
                     plain=data.draw(st.integers(0, 2), label="plain query") == 0,
                     small_limit=data.draw(st.integers(0, 5), label="small limit") % 4,
                     hostile=data.draw(st.integers(0, 5), label="hostile query") == 0,
                     hostile_param=data.draw(big, label="hostile param"),
                     hostile_value=data.draw(big, label="hostile value"),
                     big_order=data.draw(st.integers(0, 3), label="big order") == 0,
                     awaited_event=data.draw(st.integers(0, 3), label="awaited event") != 0,
                     decision=data.draw(st.integers(0, 3), label="decision"))

    def apply(self, case: Any, report: FuzzReport) -> tuple[int | None, bool]:
        """Steer ``case``; return how its continuation token was tampered with (None if it
        was not) and whether a query parameter got a hostile value."""
        method = case.method.upper()
        if "{id}" in case.path and report.accepted and self.use_known:
            known = list(report.accepted)  # grows during the run: an index, not a draw from the list
            case.path_parameters = {**(case.path_parameters or {}), "id": known[self.known_index % len(known)]}
        if (method, case.path) == ("POST", "/orders") and report.keys and self.reuse_key:
            used = report.keys[self.key_index % len(report.keys)]
            case.headers = {**(case.headers or {}), "Idempotency-Key": used}
        if (method, case.path) == ("POST", "/orders") and self.big_order and isinstance(case.body, dict):
            items = case.body.get("items")
            if isinstance(items, list) and items and isinstance(items[0], dict):
                # Generated prices are mostly tiny: an order over WAIT_OVER, which waits for approval.
                case.body = {**case.body, "items": [{**items[0], "unitPrice": str(WAIT_OVER + 1)}, *items[1:]]}
        if case.path == EVENTS_PATH and self.awaited_event:
            # The event an order v2 of over 1000 waits for, to such an order if one was accepted:
            # it takes it (202), refuses it (409: it has its event, or is finished) or its body (400).
            case.path_parameters = {**(case.path_parameters or {}), "name": AWAITED_EVENT}
            waiting = report.waiting_orders()
            if waiting and self.use_known:
                case.path_parameters["id"] = waiting[self.known_index % len(waiting)]
            if isinstance(case.body, dict) and self.decision in (0, 1, 2):
                case.body = {**case.body, AWAITED_DECISION: self.decision != 2}
        names = QUERY_PARAMS.get(case.path) if method == "GET" else None
        if not names:
            return None, False
        query = case.query = dict(case.query or {})
        if case.path == "/deadletters" and self.plain:  # a queue that exists: a page of dead letters
            query["queue"] = DEAD_LETTER_QUEUES[self.customer_index % len(DEAD_LETTER_QUEUES)]
        if self.plain:
            # The state goes too: whether an order is in flight, held or processed when the search comes
            # depends on how fast the host ran it (machine load), so a plain search by state found orders
            # on one run and none on the next.
            for name in ("continuationToken", "createdFrom", "createdTo", "failedStep", "state"):
                query.pop(name, None)
            if "workflow" in query:  # a generated name is almost never one: the one most orders run
                query["workflow"] = DEFAULT_WORKFLOW
        if self.small_limit:
            query["limit"] = str(self.small_limit)
        if case.path == "/orders" and self.known_customer and report.accepted:
            bodies = [b for b in report.accepted.values() if isinstance(b, dict)]
            if bodies:
                body = bodies[self.customer_index % len(bodies)]
                query["customerId"] = body.get("customerId")
                if self.plain and "workflow" in query:  # the workflow that order runs: the search finds it
                    query["workflow"] = body.get("workflow") or DEFAULT_WORKFLOW
        elif case.path == "/orders" and self.plain:  # a generated customer has no orders: every customer's
            query.pop("customerId", None)
        tampered = None
        token = report.tokens.pick(self.token_index, None if self.token_mode == 2 else case.path)
        # Only to a path that takes one: /deadletters pages by ``from`` and refuses any other parameter (400).
        if token is not None and self.token_mode in (0, 1, 2) and "continuationToken" in names:
            report.tokens_sent_back += 1
            if self.token_mode == 1:
                token, tampered = tamper(token, self.tamper_how), self.tamper_how
                report.tokens_tampered += 1
            query["continuationToken"] = token
        if self.hostile:
            name = names[self.hostile_param % len(names)]
            query[name] = HOSTILE_QUERY_VALUES[self.hostile_value % len(HOSTILE_QUERY_VALUES)]
            if name == "continuationToken":
                tampered = None  # no longer a token the app handed out
        return tampered, self.hostile


def operation_level(operation: Any) -> str:
    """The key level the document gives an operation: ``security: []`` is ANONYMOUS, the admin
    (master) key's schemes ADMIN, the document's default (the function key) FUNCTION."""
    security = operation.definition.raw.get("security")
    if security is None:
        return FUNCTION
    names = {name for requirement in security for name in requirement}
    if not names:
        return ANONYMOUS
    return ADMIN if any(name.startswith("adminKey") for name in names) else FUNCTION


def with_key(case: Any, keys: HostKeys | None) -> None:
    """``case`` with the key its operation takes in the ``x-functions-key`` header (the
    generated one replaced; a generated ``code`` stays: the header comes first). An anonymous
    operation keeps whatever was generated; so does every one when the host checks no key."""
    level = operation_level(case.operation)
    if keys is None or level == ANONYMOUS:
        return
    headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != KEY_HEADER}
    headers[KEY_HEADER] = keys.master if level == ADMIN else keys.function
    case.headers = headers


def _record_read(case: Any, resp: Any, report: FuzzReport, tampered: int | None) -> None:
    """A 200 of a GET: keep its continuation token; check a search page against its filters;
    a tampered token that got a 200 is recorded."""
    try:
        body = json.loads(resp.content)
    except ValueError:
        return  # the conformance checks report it
    report.tokens.record(case.path, body)
    if tampered is not None and tampered in STRICT_TAMPERING:
        report.sample(report.tampered_accepted, {**_describe(case, resp), "tampering": tampered})
    if case.path != "/orders":
        return
    report.search_pages += 1
    report.search_orders += len(body.get("orders") or []) if isinstance(body, dict) else 0
    wrong = search_violations(case.query or {}, body)
    if wrong:
        report.search_violation_count += 1
        report.sample(report.search_violations, {**_describe(case, resp), "violations": wrong[:5]})


def send_generated(base_url: str, n: int, report: FuzzReport, rng_seed: int = 0,
                   include_openapi: bool = True, progress: Callable[[FuzzReport], None] | None = None,
                   keys: HostKeys | None = None) -> None:
    """Send ``n`` generated requests to ``base_url`` (the host root), each with the key its
    operation takes of ``keys`` (``with_key``; none: the keys are not checked there); record into
    ``report``."""
    from schemathesis.core.failures import FailureGroup

    schema = _schema(include_openapi)
    strategies = _strategies(schema, n)
    checks = _checks()
    api = base_url.rstrip("/") + "/api"
    session = requests.Session()
    target = report.requests + n
    stop_at = [target]  # where the current batch ends
    last = [time.monotonic()]

    def one(case: Any, data: st.DataObject) -> None:
        steer = Steer.draw(data)
        if report.requests >= stop_at[0]:
            return
        method = case.method.upper()
        tampered, hostile = steer.apply(case, report)
        with_key(case, keys)
        try:
            resp = case.call(base_url=api, session=session, timeout=60)
        except (requests.exceptions.InvalidHeader, requests.exceptions.InvalidURL, ValueError, UnicodeError):
            report.unsendable += 1
            return
        except requests.exceptions.RequestException as exc:  # reset, timeout: as bad as a 5xx
            report.requests += 1
            report.transport_errors += 1
            report.sample(report.five_xx, {**_describe(case), "error": f"{type(exc).__name__}: {exc}"[:300]})
            return
        report.requests += 1
        status = resp.status_code
        report.by_status[status] += 1
        report.by_operation[f"{method} {case.path} {status}"] += 1
        if status >= 500:
            report.sample(report.five_xx, _describe(case, resp))
        elif 400 <= status < 500:
            report.four_xx += 1
            ok = False
            if _header(resp, "content-type").split(";")[0].strip().lower() == PROBLEM:
                try:
                    doc = json.loads(resp.content)
                    ok = isinstance(doc, dict) and doc.get("status") == status and bool(doc.get("title"))
                except ValueError:
                    ok = False
            if ok:
                report.problem_json += 1
            else:
                report.sample(report.not_problem, _describe(case, resp))
        elif (method, case.path) == ("POST", "/orders") and status in (200, 202):
            oid = json.loads(resp.content)["orderId"]
            if oid not in report.accepted:
                report.accepted[oid] = case.body
            key = (case.headers or {}).get("Idempotency-Key")
            if key and key not in report.keys:
                report.keys.append(key)
        elif method == "GET" and status == 200:
            _record_read(case, resp, report, tampered)
        if hostile:
            report.hostile_queries[status] += 1
        try:
            case.validate_response(resp, checks=checks)
        except (AssertionError, FailureGroup) as exc:  # FailureGroup is a BaseExceptionGroup
            report.conformance_failures += 1
            report.sample(report.conformance, {**_describe(case, resp), "failure": str(exc)[:500]})
        if progress is not None and time.monotonic() - last[0] > 5:
            last[0] = time.monotonic()
            progress(report)

    batch_seed = rng_seed
    while report.requests < target:
        before_round = report.requests
        for strategy, share in strategies:
            stop_at[0] = min(target, report.requests + share)
            remaining = stop_at[0] - report.requests
            if remaining <= 0:
                break
            test = settings(max_examples=remaining + remaining // 10 + 10, phases=[Phase.generate], database=None,
                            deadline=None, derandomize=False, suppress_health_check=list(HealthCheck),
                            report_multiple_bugs=False)(given(case=strategy, data=st.data())(one))
            try:
                seed(batch_seed)(test)()
            except Unsatisfiable:  # an operation with (almost) nothing to generate in this mode
                pass
            batch_seed += 1
        if report.requests == before_round:
            raise RuntimeError("a whole round of the fuzz run sent no request")


def _wait_indexed(tables: Tables, accepted: set[str], timeout: float = INDEX_WAIT_SECONDS) -> set[str]:
    """The search index's order ids once every accepted order is in it (or the timeout passed)."""
    deadline = time.monotonic() + timeout
    while True:
        indexed = tables.index_order_ids()
        if accepted <= indexed or time.monotonic() > deadline:
            return indexed
        time.sleep(1.0)


def check_rows(tables: Tables, before: Any, report: FuzzReport) -> None:
    """The tables after the run against ``before`` (a Snapshot). An order's history events
    (``history-*``) are appended as it goes on: they are counted apart from its rows, and an
    order that existed before the run may add them (its processing goes on meanwhile)."""
    accepted = set(report.accepted)
    after_index = _wait_indexed(tables, accepted)
    after_keys = tables.state_keys()
    after_deadlines = tables.deadline_order_ids()
    before_parts = {pk for pk, _ in before.state}
    new_keys = [k for k in after_keys if k not in before.state]
    new_rows = [k for k in new_keys if not is_history(k[1])]
    new_history = [k for k in new_keys if is_history(k[1])]
    per_part = Counter(pk for pk, rk in after_keys if not is_history(rk))
    rejected_rows = sorted(k for k in new_keys
                           if k[0] not in accepted and not (k[0] in before_parts and is_history(k[1])))
    missing = sorted(o for o in accepted if per_part[o] == 0)
    expected = {oid: rows_of(body) for oid, body in report.accepted.items()}
    wrong = sorted(o for o in accepted if o not in before_parts and per_part[o] not in (0, expected[o]))
    changed = []
    for oid, body in report.accepted.items():
        if oid in before_parts:
            continue
        row = tables.state.get_entity(partition_key=oid, row_key="order") if per_part[oid] else None
        if row is None or not isinstance(body, dict):
            continue
        # The currency is stored upper-case (an accepted "eur" is stored "EUR").
        if row.get("CustomerId") != body.get("customerId") or row.get("Currency") != str(body.get("currency")).upper() \
                or len(json.loads(row.get("Items") or "[]")) != len(body.get("items") or []):
            changed.append({"orderId": oid, "row": {k: row.get(k) for k in ("CustomerId", "Currency")},
                            "accepted": {k: body.get(k) for k in ("customerId", "currency")}})
    stray_deadlines = sorted(o for o in after_deadlines - before.deadline_orders if o not in accepted)
    stray_index = sorted(after_index - before.index_orders - accepted - before_parts)
    not_indexed = sorted(o for o in accepted if per_part[o] and o not in after_index)
    report.rows = {
        "stateRowsBefore": len(before.state), "stateRowsAfter": len(after_keys),
        "partitionsBefore": len(before_parts), "partitionsAfter": len(per_part),
        "newStateRows": len(new_rows), "newHistoryRows": len(new_history),
        "acceptedOrders": len(accepted),
        "rowsPerOrder": {str(k): v for k, v in sorted(Counter(expected.values()).items())},  # rows -> orders
        "expectedNewStateRows": sum(expected[o] for o in accepted - before_parts),
        "rowsOfRejected": len(rejected_rows), "rejectedSamples": rejected_rows[:SAMPLES],
        "acceptedWithoutRows": len(missing), "acceptedWithoutRowsSamples": missing[:SAMPLES],
        "ordersWithWrongRowCount": len(wrong), "wrongRowCountSamples": wrong[:SAMPLES],
        "orderRowsChanged": len(changed), "orderRowsChangedSamples": changed[:SAMPLES],
        "deadlineOrdersBefore": len(before.deadline_orders), "deadlineOrdersAfter": len(after_deadlines),
        "deadlineRowsOfRejected": len(stray_deadlines), "deadlineSamples": stray_deadlines[:SAMPLES],
        "indexOrdersBefore": len(before.index_orders), "indexOrdersAfter": len(after_index),
        "indexRowsOfRejected": len(stray_index), "indexSamples": stray_index[:SAMPLES],
        "acceptedNotIndexed": len(not_indexed), "notIndexedSamples": not_indexed[:SAMPLES],
    }


def run(base_url: str, tables: Tables, n: int, rng_seed: int = 0,
        progress: Callable[[FuzzReport], None] | None = None, keys: HostKeys | None = None) -> FuzzReport:
    """The fuzz run against the host at ``base_url`` whose keys are ``keys`` (``Stack.keys``)."""
    report = FuzzReport(seed=rng_seed)
    before = tables.snapshot()
    t0 = time.monotonic()
    send_generated(base_url, n, report, rng_seed, include_openapi=function_app_registers_openapi(),
                   progress=progress, keys=keys)
    report.seconds = time.monotonic() - t0
    check_rows(tables, before, report)
    return report


def summary(j: dict[str, Any]) -> str:
    r, sr, tk = j["rows"], j["search"], j["continuationTokens"]
    return (f"requests {j['requests']} ({j['seconds']}s, seed {j['seed']}, {j['unsendableGenerated']} generated "
            f"requests unsendable by the client)\n"
            f"  by status: {j['byStatus']}\n"
            f"  5xx: {j['5xx']} (no answer: {j['transportErrors']})\n"
            f"  4xx: {j['problemJson']['4xx']}, problem+json: {j['problemJson']['compliant']}, "
            f"not: {j['problemJson']['nonCompliant']}\n"
            f"  openapi conformance failures: {j['conformanceFailures']}\n"
            f"  accepted orders: {j['acceptedOrders']}\n"
            f"  searches answered 200: {sr['pages']} ({sr['orders']} orders), outside their filters: "
            f"{sr['filterViolations']}\n"
            f"  continuation tokens handed out {tk['handedOut']}, sent back {tk['sentBack']}, tampered "
            f"{tk['tampered']}, tampered and accepted: {tk['tamperedAccepted']}; hostile query values by status: "
            f"{j['hostileQueries']}\n"
            f"  state rows before {r['stateRowsBefore']} after {r['stateRowsAfter']} "
            f"(new {r['newStateRows']} = the new accepted orders' rows: {r['expectedNewStateRows']}, orders by rows "
            f"{r['rowsPerOrder']}; "
            f"history events {r['newHistoryRows']}); "
            f"rows of rejected requests: {r['rowsOfRejected']}; deadline rows of rejected: "
            f"{r['deadlineRowsOfRejected']}; search index rows of rejected: {r['indexRowsOfRejected']}; "
            f"accepted not indexed: {r['acceptedNotIndexed']}; order rows changed: {r['orderRowsChanged']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.hostile.fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--instances", type=int, default=1)
    args = ap.parse_args(argv)
    def _stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _stop)  # the finally below stops the stack by PID
    print(f"starting the local stack; fuzz seed {args.seed}", flush=True)
    stack = start_stack(instances=args.instances)
    tables = Tables(stack)
    try:
        print(f"sending {args.requests} generated requests to {stack.api_url}", flush=True)
        report = run(stack.base_url, tables, args.requests, args.seed,
                     progress=lambda r: print(f"  ... {r.requests} requests, {dict(r.by_status)}", flush=True),
                     keys=stack.keys)
    finally:
        tables.close()
        stack.stop()
    j = report.as_json()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(j, indent=2) + "\n", encoding="utf-8")
    print(summary(j))
    print(f"written to {out}")
    problems = report.violations()
    for p in problems:
        print("VIOLATION: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
