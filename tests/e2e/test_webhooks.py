"""Issue 45's webhook target through the whole local stack (Azurite, the Service Bus emulator, the
local Functions host with two instances, the remote-services simulator): with a receiver that fails
every first try, every one of 10 ended orders (3 failed, 7 processed) is told, with a valid signature.

The receiver runs in the test, on 127.0.0.1 (``WebhookUrl``: an http URL is allowed for this host
only). It checks each signature with the Standard Webhooks algorithm written here, apart from the
app's (``shared.core.webhooks.sign``): ``v1,`` + base64 HMAC-SHA256, keyed by the base64 after
``whsec_``, of ``{webhook-id}.{webhook-timestamp}.{body}``, the timestamp within 5 minutes.
``WebhookRetrySchedule`` is short (2 s, then 5 s...) so that a second try comes quickly.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from local.stack import Stack
from tests.hostile.stackutil import GOOD_BODY, send, settled_states, start_stack, submit

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")
SOLD_OUT = "SKU-SOLD-OUT"


def valid(headers: dict[str, str], body: bytes) -> bool:
    """The spec's verification, independent of the app's code."""
    msg_id, stamp, signature = (headers.get(h, "") for h in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    if not (msg_id and stamp.isdigit() and signature) or abs(time.time() - int(stamp)) > 300:
        return False
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    expected = hmac.new(key, msg_id.encode() + b"." + stamp.encode() + b"." + body, hashlib.sha256).digest()
    for part in signature.split(" "):
        version, _, sig = part.partition(",")
        if version == "v1" and hmac.compare_digest(base64.b64decode(sig), expected):
            return True
    return False


class Receiver(ThreadingHTTPServer):
    """Fails each webhook-id's first try (503); answers 204 to any later one."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.tries: list[dict[str, Any]] = []
        self.hold_first = 0.0  # seconds a first try is held before its 503 (a test kills instances meanwhile)
        self.holding = 0  # first tries being held now

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hooks"

    def told(self) -> dict[str, dict[str, Any]]:
        """webhook-id -> the event, for each id a try succeeded for."""
        with self.lock:
            return {t["id"]: t["event"] for t in self.tries if t["status"] == 204}


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802 - the http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        headers = {k.lower(): v for k, v in self.headers.items()}
        with self.server.lock:
            first = not any(t["id"] == headers.get("webhook-id") for t in self.server.tries)
            status = 503 if first else 204
            self.server.tries.append({"id": headers.get("webhook-id"), "valid": valid(headers, body), "body": body,
                                      "event": json.loads(body), "status": status})
            hold = self.server.hold_first if first else 0.0
            self.server.holding += 1 if hold else 0
        if hold:
            time.sleep(hold)
            with self.server.lock:
                self.server.holding -= 1
        try:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
        except OSError:
            pass  # the instance that sent it was killed meanwhile

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("webhooks-stack"), instances=2, WebhookUrl=receiver.url,
                    WebhookSecret=SECRET, WebhookRetrySchedule="2s,5s,10s,30s")
    try:
        yield s
    finally:
        s.stop()


def test_every_ended_order_is_told_with_a_valid_signature_though_every_first_try_fails(
        stack: Stack, receiver: Receiver) -> None:
    stack.remotes.set_faults("inventory", rejectSkus=[SOLD_OUT])
    try:
        good = [submit(stack, GOOD_BODY) for _ in range(7)]
        bad = [submit(stack, {**GOOD_BODY, "customerId": "c-failing",
                              "items": [{"sku": SOLD_OUT, "quantity": 1, "unitPrice": 5}]}) for _ in range(3)]
        states = settled_states(stack, good + bad, timeout=120)
    finally:
        stack.remotes.set_faults("inventory")
    assert [states[o]["ProcessState"] for o in good] == ["Processed"] * 7
    assert [states[o]["ProcessState"] for o in bad] == ["Error"] * 3

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(receiver.told()) < 10:
        time.sleep(0.5)
    told = receiver.told()
    by_order = {e["data"]["orderId"]: e["type"] for e in told.values()}
    assert by_order == {**{o: "order.processed" for o in good}, **{o: "order.failed" for o in bad}}, by_order
    with receiver.lock:
        tries = list(receiver.tries)
    assert all(t["valid"] for t in tries), [t["id"] for t in tries if not t["valid"]]
    for webhook_id in told:  # every first try failed; each try sent the same id and the same body
        mine = [t for t in tries if t["id"] == webhook_id]
        assert mine[0]["status"] == 503 and len(mine) >= 2, mine
        assert len({t["body"] for t in mine}) == 1
    print(f"\n10 orders told in {len(tries)} tries ({len(tries) - len(told)} first tries refused)")

    # Nothing gave up: the operator's list of failed deliveries is empty.
    r = send(stack, "GET", "/api/webhooks?state=failed")
    assert r.status == 200 and r.json() == {"deliveries": []}, r.body


def test_no_ending_is_lost_when_the_instances_die_in_the_middle_of_their_tries(stack: Stack,
                                                                                 receiver: Receiver) -> None:
    """Each first try is held 4 s by the receiver; while some are held, both host instances are
    killed (SIGKILL). The tries they were making die with them: each comes again (its message
    redelivered once its lock expires, or sent again by its watch), and every ended order is told."""
    receiver.hold_first = 4.0
    seen_before = set(receiver.told())
    stack.remotes.set_faults("inventory", rejectSkus=[SOLD_OUT])
    try:
        good = [submit(stack, GOOD_BODY) for _ in range(8)]
        bad = [submit(stack, {**GOOD_BODY, "customerId": "c-failing",
                              "items": [{"sku": SOLD_OUT, "quantity": 1, "unitPrice": 5}]}) for _ in range(2)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and receiver.holding < 3:
            time.sleep(0.05)
        held = receiver.holding
        assert held >= 3, "no first try was being held: nothing to kill in the middle of"
        killed = [stack.kill_host_instance(k) for k in sorted(stack.host_instances())]
        for instance, pid in killed:
            stack.wait_host_instance_replaced(instance, pid)
        states = settled_states(stack, good + bad, timeout=180)
    finally:
        stack.remotes.set_faults("inventory")
        receiver.hold_first = 0.0
    assert [states[o]["ProcessState"] for o in good] == ["Processed"] * 8
    assert [states[o]["ProcessState"] for o in bad] == ["Error"] * 2

    deadline = time.monotonic() + 180  # a try cut short comes again after its lock (1 min) or its watch
    while time.monotonic() < deadline and len(set(receiver.told()) - seen_before) < 10:
        time.sleep(0.5)
    told = {i: e for i, e in receiver.told().items() if i not in seen_before}
    by_order = {e["data"]["orderId"]: e["type"] for e in told.values()}
    assert by_order == {**{o: "order.processed" for o in good}, **{o: "order.failed" for o in bad}}, by_order
    with receiver.lock:
        tries = [t for t in receiver.tries if t["id"] in told]
    assert all(t["valid"] for t in tries)
    for webhook_id in told:
        assert len({t["body"] for t in tries if t["id"] == webhook_id}) == 1
    print(f"\n{held} first tries held when {len(killed)} instances were killed; 10 orders told in {len(tries)} tries")
