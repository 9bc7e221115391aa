"""Generated requests against the app on the local host (schemathesis, from functions/openapi.yaml).

    python -m tests.hostile.fuzz --requests 10000 [--seed N] [--out bench/results/fuzz.json]

starts the local stack (Azurite, the Service Bus emulator, the remote services, the local
Functions host with the app), sends that many generated requests (positive and negative
cases of every operation; ids of accepted orders and used Idempotency-Keys are fed back in,
so GET/retry/cancel and key reuse reach real orders), stops the stack, then prints and writes:

* requests sent, counts by status and by operation;
* 5xx responses (must be 0);
* 4xx responses and how many are application/problem+json with a matching ``status``
  (must be all);
* schemathesis conformance failures against the document (status codes, content types,
  response schemas and headers: the document must describe the API as implemented);
* rows: the state table and deadline index before and after; every new partition belongs to
  an accepted order (``rowsOfRejected`` must be 0), every accepted order has exactly its rows,
  and its order row holds the body that was accepted (no 409 replay overwrote it).

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
from pathlib import Path
from typing import Any

import requests
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from local.procs import REPO_ROOT
from tests.hostile.stackutil import PROBLEM, Tables, function_app_registers_openapi, start_stack

SPEC_PATH = REPO_ROOT / "functions" / "openapi.yaml"
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "fuzz.json"
SAMPLES = 20


def rows_per_order() -> int:
    from shared.workflow import WORKFLOW

    return 2 + len(WORKFLOW)


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
    accepted: dict[str, dict[str, Any]] = field(default_factory=dict)  # orderId -> first accepted body
    keys: list[str] = field(default_factory=list)
    rows: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

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
        return out


def _schema(include_openapi: bool) -> Any:
    import schemathesis

    schema = schemathesis.openapi.from_path(str(SPEC_PATH))
    if not include_openapi:
        schema = schema.exclude(path="/openapi.yaml")
    return schema


def _strategy(schema: Any) -> Any:
    from schemathesis import GenerationMode

    parts = []
    for result in schema.get_all_operations():
        op = result.ok()
        weight = 4 if (op.method.upper(), op.path) == ("POST", "/orders") else 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            parts.extend([op.as_strategy(generation_mode=mode)] * weight)
    return st.one_of(parts)


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
                           "headers": {k: v for k, v in (case.headers or {}).items()
                                       if k.lower() in ("content-type", "idempotency-key")},
                           "body": json.dumps(body, default=str)[:300] if body is not None else None}
    if resp is not None:
        out.update(status=resp.status_code, contentType=_header(resp, "content-type"),
                   response=resp.content[:300].decode("utf-8", "replace"))
    return out


def send_generated(base_url: str, n: int, report: FuzzReport, rng_seed: int = 0,
                   include_openapi: bool = True, progress: Callable[[FuzzReport], None] | None = None) -> None:
    """Send ``n`` generated requests to ``base_url`` (the host root); record into ``report``."""
    from schemathesis.core.failures import FailureGroup

    schema = _schema(include_openapi)
    strategy = _strategy(schema)
    checks = _checks()
    api = base_url.rstrip("/") + "/api"
    session = requests.Session()
    target = report.requests + n
    last = [time.monotonic()]

    def one(case: Any, data: st.DataObject) -> None:
        # Every draw is made whatever the run's state (known ids, used keys, the target): a
        # draw that depends on external state makes hypothesis see one prefix draw two ways.
        use_known = data.draw(st.integers(0, 2), label="known id") == 0
        known_index = data.draw(st.integers(0, 2**31), label="id")
        reuse_key = data.draw(st.integers(0, 5), label="reuse key") == 0
        key_index = data.draw(st.integers(0, 2**31), label="key")
        if report.requests >= target:
            return
        method = case.method.upper()
        if case.path != "/orders" and case.path != "/openapi.yaml" and report.accepted and use_known:
            known = sorted(report.accepted)  # grows during the run: an index, not a draw from the list
            case.path_parameters = {"id": known[known_index % len(known)]}
        if (method, case.path) == ("POST", "/orders") and report.keys and reuse_key:
            used = report.keys[key_index % len(report.keys)]
            case.headers = {**(case.headers or {}), "Idempotency-Key": used}
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
        remaining = target - report.requests
        test = settings(max_examples=remaining + remaining // 10 + 10, phases=[Phase.generate], database=None,
                        deadline=None, derandomize=False, suppress_health_check=list(HealthCheck),
                        report_multiple_bugs=False)(given(case=strategy, data=st.data())(one))
        seed(batch_seed)(test)()
        batch_seed += 1


def check_rows(tables: Tables, before: Any, report: FuzzReport) -> None:
    after_keys = tables.state_keys()
    after_deadlines = tables.deadline_order_ids()
    before_parts = {pk for pk, _ in before.state}
    new_rows = [k for k in after_keys if k not in before.state]
    per_part = Counter(pk for pk, _ in after_keys)
    accepted = set(report.accepted)
    rejected_rows = sorted(k for k in new_rows if k[0] not in accepted)
    missing = sorted(o for o in accepted if per_part[o] == 0)
    expected = rows_per_order()
    wrong = sorted(o for o in accepted if o not in before_parts and per_part[o] not in (0, expected))
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
    report.rows = {
        "stateRowsBefore": len(before.state), "stateRowsAfter": len(after_keys),
        "partitionsBefore": len(before_parts), "partitionsAfter": len(per_part),
        "newStateRows": len(new_rows), "acceptedOrders": len(accepted), "rowsPerOrder": expected,
        "expectedNewStateRows": expected * len(accepted - before_parts),
        "rowsOfRejected": len(rejected_rows), "rejectedSamples": rejected_rows[:SAMPLES],
        "acceptedWithoutRows": len(missing), "acceptedWithoutRowsSamples": missing[:SAMPLES],
        "ordersWithWrongRowCount": len(wrong), "wrongRowCountSamples": wrong[:SAMPLES],
        "orderRowsChanged": len(changed), "orderRowsChangedSamples": changed[:SAMPLES],
        "deadlineOrdersBefore": len(before.deadline_orders), "deadlineOrdersAfter": len(after_deadlines),
        "deadlineRowsOfRejected": len(stray_deadlines), "deadlineSamples": stray_deadlines[:SAMPLES],
    }


def run(base_url: str, tables: Tables, n: int, rng_seed: int = 0,
        progress: Callable[[FuzzReport], None] | None = None) -> FuzzReport:
    report = FuzzReport(seed=rng_seed)
    before = tables.snapshot()
    t0 = time.monotonic()
    send_generated(base_url, n, report, rng_seed, include_openapi=function_app_registers_openapi(),
                   progress=progress)
    report.seconds = time.monotonic() - t0
    check_rows(tables, before, report)
    return report


def summary(j: dict[str, Any]) -> str:
    r = j["rows"]
    return (f"requests {j['requests']} ({j['seconds']}s, seed {j['seed']}, {j['unsendableGenerated']} generated "
            f"requests unsendable by the client)\n"
            f"  by status: {j['byStatus']}\n"
            f"  5xx: {j['5xx']} (no answer: {j['transportErrors']})\n"
            f"  4xx: {j['problemJson']['4xx']}, problem+json: {j['problemJson']['compliant']}, "
            f"not: {j['problemJson']['nonCompliant']}\n"
            f"  openapi conformance failures: {j['conformanceFailures']}\n"
            f"  accepted orders: {j['acceptedOrders']}\n"
            f"  state rows before {r['stateRowsBefore']} after {r['stateRowsAfter']} "
            f"(new {r['newStateRows']} = {r['rowsPerOrder']} x new accepted orders: {r['expectedNewStateRows']}); "
            f"rows of rejected requests: {r['rowsOfRejected']}; deadline rows of rejected: "
            f"{r['deadlineRowsOfRejected']}; order rows changed: {r['orderRowsChanged']}")


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
                     progress=lambda r: print(f"  ... {r.requests} requests, {dict(r.by_status)}", flush=True))
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
