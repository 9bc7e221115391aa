# proton's type hints are partial (Optional everywhere, str for binary tags): checked by tests instead.
# mypy: disable-error-code="union-attr, arg-type, no-redef, var-annotated"
"""The AMQP 1.0 side: proton's engine (Connection/Transport/Collector) on our own selector loop.

One thread, one loop. Each iteration:

1. read whatever the sockets have and push it into the proton transports;
2. handle every proton event (attach, flow, transfers, dispositions, management requests);
3. fire the broker's timers and pump available messages to links with credit;
4. commit the store (ONE SQLite transaction for everything this iteration changed);
5. only then write the transports' output to the sockets.

So an ``accepted`` for a send, the answer to a settlement and every management reply leave
the process only after the change they report is committed (see :mod:`.store`).

Wire details follow what the azure-servicebus SDK (pyamqp) does: plain AMQP without SASL,
``$cbs`` put-token always answered 202, ``<entity>/$management`` answered with ``statusCode``,
16-byte delivery tags (the lock token), settlement answered with the same outcome, session
filter and ``com.microsoft:locked-until-utc`` (.NET ticks) on the attach, ``amqp:not-found``
for an unknown entity.
"""

from __future__ import annotations

import logging
import selectors
import socket
import time
import uuid
from typing import Any

import cproton
from cproton_ffi import ffi as _ffi
from cproton_ffi import lib as _lib
from proton import UNDESCRIBED as _UNDESCRIBED
from proton import (
    Array,
    Collector,
    Condition,
    Connection,
    Data,
    Delivery,
    Endpoint,
    Event,
    Link,
    Message,
    Terminus,
    Transport,
    symbol,
    timestamp,
)

from . import codec
from .broker import Broker, BrokerError, Consumer, Entity, now_ms

log = logging.getLogger("servicebus.server")

SESSION_FILTER = symbol("com.microsoft:session-filter")
LOCKED_UNTIL_UTC = symbol("com.microsoft:locked-until-utc")
OPERATION_TIMEOUT = "com.microsoft:timeout"
DOTNET_EPOCH_TICKS = 621355968000000000
MAX_MESSAGE_SIZE = 256 * 1024
SEND_CREDIT = 1000


# Raw proton-C calls for the hot paths (the Python wrappers cost several objects per event).
_PN_DELIVERY = cproton.PN_DELIVERY
_PN_LINK_FLOW = cproton.PN_LINK_FLOW
_PN_TRANSPORT = cproton.PN_TRANSPORT  # a connection's transport may have output to write
_PN_LOCAL_CLOSED = cproton.PN_LOCAL_CLOSED
_ACCEPTED = cproton.PN_ACCEPTED
_REJECTED = cproton.PN_REJECTED
_MODIFIED = cproton.PN_MODIFIED
_NULL = _ffi.NULL
_IO_BUF = 1 << 20
# Each iteration writes only the connections that may have output (read from, or named by a
# PN_TRANSPORT event); every connection is ticked and written at least this often regardless, and
# whenever one's tick deadline (heartbeats, idle timeout) has come.
FULL_FLUSH_S = 0.25


def _ptr(impl: Any) -> int:
    return int(_ffi.cast("uintptr_t", impl))


def _ticks(ms: int) -> int:
    return DOTNET_EPOCH_TICKS + ms * 10_000


def entity_path(address: str | None) -> str:
    """``amqps://host:port/queue/$DeadLetterQueue`` → ``queue/$DeadLetterQueue``."""
    if not address:
        return ""
    a = address
    if "://" in a:
        a = a.split("://", 1)[1]
        a = a.split("/", 1)[1] if "/" in a else ""
    a = a.split("?", 1)[0]
    return a.strip("/")


class LinkCtx:
    """What a proton link is for. Kept in ``Server.ctxs``, keyed by the link's C pointer."""

    __slots__ = ("kind", "entity", "node", "consumer", "sink", "link")

    def __init__(self, kind: str, link: Link, entity: Entity | None = None, node: str = "") -> None:
        self.kind = kind  # send | receive | request | reply
        self.link = link  # the wrapper keeps a reference: the pointer stays valid while we know the link
        self.entity = entity
        self.node = node
        self.consumer: Consumer | None = None
        self.sink: LinkSink | None = None


class LinkSink:
    """The broker's view of a receiving client link (our proton sender)."""

    __slots__ = ("link", "impl", "server", "consumer", "opened", "__weakref__")

    def __init__(self, link: Link, server: Server) -> None:
        self.link = link
        self.impl = link._impl
        self.server = server
        self.consumer: Consumer | None = None
        self.opened = False

    def credit(self) -> int:
        impl = self.impl
        if _lib.pn_link_state(impl) & _PN_LOCAL_CLOSED:
            return 0
        return _lib.pn_link_credit(impl)

    def deliver(self, payload: bytes, tag: bytes, settled: bool) -> None:
        impl = self.impl
        d = _lib.pn_delivery(impl, (len(tag), _ffi.from_buffer(tag)))
        _lib.pn_link_send(impl, _ffi.from_buffer(payload), len(payload))
        _lib.pn_link_advance(impl)
        if settled:
            _lib.pn_delivery_settle(d)

    def session_assigned(self, session_id: str, locked_until_ms: int) -> None:
        link = self.link
        f: Data = link.source.filter
        f.clear()
        f.put_map()
        f.enter()
        f.put_symbol(SESSION_FILTER)
        f.put_string(session_id)
        f.exit()
        link.properties = {LOCKED_UNTIL_UTC: _ticks(locked_until_ms)}
        if not self.opened:
            self.opened = True
            link.open()

    def session_wait_timeout(self) -> None:
        self.server.refuse(self.link, "com.microsoft:timeout",
                           "No session available to accept within the operation timeout.")

    def session_lost(self) -> None:
        self.server.refuse(self.link, "com.microsoft:session-lock-lost", "The session lock has expired.")


class Conn:
    __slots__ = ("sock", "transport", "connection", "links", "closed", "writing", "peer", "deferred",
                 "deferred_at", "got_input")

    def __init__(self, sock: socket.socket, transport: Transport, connection: Connection, peer: Any) -> None:
        self.sock = sock
        self.transport = transport
        self.connection = connection
        self.links: list[Link] = []
        self.closed = False
        self.writing = False
        self.peer = peer
        # Accepted management requests whose settlement is held back (see Server._on_request).
        self.deferred: list[Delivery] = []
        self.deferred_at = 0.0
        self.got_input = False


class Server:
    def __init__(self, broker: Broker, host: str, port: int) -> None:
        self.broker = broker
        self.collector = Collector()
        self.sel = selectors.DefaultSelector()
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind((host, port))
        self.lsock.listen(256)
        self.lsock.setblocking(False)
        self.address = self.lsock.getsockname()
        self.sel.register(self.lsock, selectors.EVENT_READ, None)
        # signal.set_wakeup_fd(server.wakeup_fd) makes a signal wake the selector at once
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.wakeup_fd = self._wake_w.fileno()
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.conns: dict[int, Conn] = {}
        self.by_connection: dict[Connection, Conn] = {}
        self.by_transport: dict[int, Conn] = {}  # transport pointer -> connection (PN_TRANSPORT events)
        self._dirty: set[Conn] = set()  # connections that may have output since the last flush
        self._full_at = 0.0  # when every connection was last ticked and written
        self._tick_due = 0  # ms: the earliest tick deadline of any connection (0: none)
        self.drain_links: set[Link] = set()
        self.after_iteration: Any = None  # called at the end of every loop iteration (stats file)
        self.ctxs: dict[int, LinkCtx] = {}
        self._col = self.collector._impl
        self._iobuf = bytearray(_IO_BUF)
        self._iobuf_c = _ffi.from_buffer(self._iobuf)
        self._iobuf_view = memoryview(self._iobuf)
        self._stop = False
        self._handlers = {
            Event.CONNECTION_REMOTE_OPEN: self._on_connection_remote_open,
            Event.SESSION_REMOTE_OPEN: self._on_session_remote_open,
            Event.LINK_REMOTE_OPEN: self._on_link_remote_open,
            Event.LINK_REMOTE_CLOSE: self._on_link_remote_close,
            Event.LINK_REMOTE_DETACH: self._on_link_remote_close,
            Event.SESSION_REMOTE_CLOSE: self._on_session_remote_close,
            Event.CONNECTION_REMOTE_CLOSE: self._on_connection_remote_close,
            Event.TRANSPORT_CLOSED: self._on_transport_closed,
        }
        # Events handled through the proton wrappers; DELIVERY and LINK_FLOW take the raw fast path.
        self._slow_types = {et.number for et in self._handlers}

    # ============================================================ loop
    def stop(self) -> None:
        self._stop = True

    def run(self) -> None:
        try:
            while not self._stop:
                self.run_once()
        finally:
            self.shutdown()

    def run_once(self, max_wait: float = 1.0) -> None:
        broker = self.broker
        timeout = max_wait
        deadline = broker.next_deadline()
        now_s = time.time()
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline / 1000.0 - now_s))
        if self._dirty:
            timeout = 0
        events = self.sel.select(timeout)
        for key, mask in events:
            if key.data is None:
                self._accept()
                continue
            if key.data == "wake":
                try:
                    self._wake_r.recv(4096)
                except OSError:
                    pass
                continue
            c: Conn = key.data
            if mask & selectors.EVENT_READ:
                self._read(c)
            if mask & selectors.EVENT_WRITE:
                self._write(c)
        self._process_events()
        self._settle_deferred(now_s)
        now = now_ms()
        broker.tick(now)
        broker.pump(now)
        if self.drain_links:
            for link in list(self.drain_links):
                if link.drain_mode and link.credit > 0:
                    link.drained()
            self.drain_links.clear()
        self._process_events()
        broker.commit()
        self._flush_all(now / 1000.0)
        if self.after_iteration is not None:
            self.after_iteration()

    def _settle_deferred(self, now_s: float) -> None:
        """Settle held-back management requests once the client sent something new (or after 1 s).

        pyamqp reads one frame per poll while it opens a link and sleeps 50 ms between polls,
        so every frame queued ahead of an attach costs the client 50 ms. The client never waits
        for the settlement of a request (only for the reply), so the settlement goes out
        together with the next answer, where proton orders it after the attach.
        """
        for c in self.conns.values():
            if c.deferred and (c.got_input and c.deferred_at < now_s or now_s - c.deferred_at > 1.0):
                links = set()
                for d in c.deferred:
                    try:
                        d.update(Delivery.ACCEPTED)
                        d.settle()
                        links.add(d.link)
                    except Exception:  # noqa: BLE001
                        pass
                c.deferred.clear()
                for link in links:
                    if not link.state & Endpoint.LOCAL_CLOSED and link.credit < 100:
                        link.flow(100 - max(link.credit, 0))
            c.got_input = False

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self.lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("accept failed: %s", e)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = Connection()
            connection.collect(self.collector)
            transport = Transport(Transport.SERVER)
            transport.max_frame_size = 65536
            transport.bind(connection)
            c = Conn(sock, transport, connection, peer)
            self.conns[sock.fileno()] = c
            self.by_connection[connection] = c
            self.by_transport[_ptr(transport._impl)] = c
            self._dirty.add(c)
            self.sel.register(sock, selectors.EVENT_READ, c)

    def _read(self, c: Conn) -> None:
        t = c.transport._impl
        sock = c.sock
        while True:
            cap = _lib.pn_transport_capacity(t)
            if cap <= 0:
                return
            want = min(cap, _IO_BUF)
            try:
                n = sock.recv_into(self._iobuf_view[:want])
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                _lib.pn_transport_close_tail(t)
                _lib.pn_transport_close_head(t)
                self._dirty.add(c)
                return
            if n == 0:
                _lib.pn_transport_close_tail(t)
                self._dirty.add(c)
                return
            _lib.pn_transport_push(t, self._iobuf_c, n)
            c.got_input = True
            self._dirty.add(c)  # input may be answered at the transport level (no event says so)
            if n < want:
                return

    def _write(self, c: Conn) -> None:
        t = c.transport._impl
        sock = c.sock
        while True:
            p = _lib.pn_transport_pending(t)
            if p <= 0:
                break
            n = _lib.pn_transport_peek(t, self._iobuf_c, min(p, _IO_BUF))
            if n <= 0:
                break
            try:
                sent = sock.send(self._iobuf_view[:n])
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                _lib.pn_transport_close_head(t)
                _lib.pn_transport_close_tail(t)
                break
            _lib.pn_transport_pop(t, sent)
            if sent < n:
                break
        want = _lib.pn_transport_pending(t) > 0
        if want != c.writing:
            c.writing = want
            if not c.closed:
                self.sel.modify(c.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0), c)

    def _flush_all(self, now_s: float) -> None:
        """Write the output of every connection that may have some: the ones read from or named
        by a PN_TRANSPORT event since the last flush; all of them, ticked, every FULL_FLUSH_S and
        whenever a tick deadline has come. (Writing and checking every connection of a loaded
        stack on every iteration cost CPU in proportion to the connections: ~20% of the
        emulator's CPU per order.)"""
        dead = []
        now_ms_ = int(now_s * 1000)
        full = now_s - self._full_at >= FULL_FLUSH_S or (self._tick_due and now_ms_ >= self._tick_due)
        if full:
            self._full_at = now_s
            self._tick_due = 0
        targets = list(self.conns.values()) if full else [c for c in self._dirty if not c.closed]
        self._dirty.clear()
        for c in targets:
            t = c.transport._impl
            if full:
                tick_at = _lib.pn_transport_tick(t, now_ms_)  # ms: its next deadline (0: none)
                if tick_at and (not self._tick_due or tick_at < self._tick_due):
                    self._tick_due = tick_at
            self._write(c)
            if _lib.pn_transport_closed(t) or (_lib.pn_transport_pending(t) < 0 and _lib.pn_transport_capacity(t) < 0):
                dead.append(c)
        for c in dead:
            self._drop(c)
        if dead:
            self._process_events()

    def _drop(self, c: Conn) -> None:
        if c.closed:
            return
        c.closed = True
        self.conns.pop(c.sock.fileno(), None)
        self.by_transport.pop(_ptr(c.transport._impl), None)
        self._dirty.discard(c)
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        try:
            c.sock.close()
        except OSError:
            pass
        self._forget_links(c)
        self.by_connection.pop(c.connection, None)
        try:
            c.transport.unbind()
        except Exception:  # noqa: BLE001
            pass

    def _forget_links(self, c: Conn) -> None:
        now = now_ms()
        for link in c.links:
            ctx = self.ctxs.pop(_ptr(link._impl), None)
            if ctx is not None and ctx.consumer is not None:
                self.broker.detach(ctx.consumer, now)
                ctx.consumer = None
        c.links.clear()

    def shutdown(self) -> None:
        for c in list(self.conns.values()):
            try:
                c.connection.close()
                self._write(c)
            except Exception:  # noqa: BLE001
                pass
            self._drop(c)
        for sock in (self.lsock, self._wake_r):
            try:
                self.sel.unregister(sock)
            except (KeyError, ValueError):
                pass
            sock.close()
        self._wake_w.close()

    # ============================================================ events
    def _process_events(self) -> None:
        col = self._col
        peek = _lib.pn_collector_peek
        pop = _lib.pn_collector_pop
        etype = _lib.pn_event_type
        handlers = self._handlers
        while True:
            ev = peek(col)
            if ev == _NULL:
                return
            t = etype(ev)
            try:
                if t == _PN_DELIVERY:
                    self._on_raw_delivery(ev)
                elif t == _PN_LINK_FLOW:
                    self._on_raw_flow(ev)
                elif t == _PN_TRANSPORT:
                    c = self.by_transport.get(_ptr(_lib.pn_event_transport(ev)))
                    if c is not None:
                        self._dirty.add(c)
                elif t in self._slow_types:
                    event = Event.wrap(ev)
                    handlers[event.type](event)
            except Exception:  # noqa: BLE001
                log.exception("error handling proton event %s", t)
            pop(col)

    def _register(self, ctx: LinkCtx) -> LinkCtx:
        self.ctxs[_ptr(ctx.link._impl)] = ctx
        return ctx

    def _ctx(self, link: Link) -> LinkCtx | None:
        return self.ctxs.get(_ptr(link._impl))

    def _on_connection_remote_open(self, ev: Event) -> None:
        conn = ev.connection
        if conn.state & Endpoint.LOCAL_UNINIT:
            conn.container = "servicebus-emulator"
            conn.open()

    def _on_session_remote_open(self, ev: Event) -> None:
        ssn = ev.session
        if ssn.state & Endpoint.LOCAL_UNINIT:
            ssn.open()

    def _on_session_remote_close(self, ev: Event) -> None:
        ssn = ev.session
        if not ssn.state & Endpoint.LOCAL_CLOSED:
            ssn.close()

    def _on_connection_remote_close(self, ev: Event) -> None:
        conn = ev.connection
        c = self.by_connection.get(conn)
        if c is not None:
            self._forget_links(c)
        if not conn.state & Endpoint.LOCAL_CLOSED:
            conn.close()

    def _on_transport_closed(self, ev: Event) -> None:
        conn = ev.connection
        c = self.by_connection.get(conn) if conn is not None else None
        if c is not None:
            self._forget_links(c)

    def refuse(self, link: Link, condition: str, description: str) -> None:
        """Refuse or end a link with an error.

        A link not yet attached is refused as AMQP prescribes: an attach with a null terminus,
        then a detach carrying the error. pyamqp marks such a link detached at once, so it reads
        the error from the detach instead of racing to send on a link it believes attached.
        """
        if link.state & Endpoint.LOCAL_CLOSED:
            return
        if link.state & Endpoint.LOCAL_UNINIT:
            link.source.type = Terminus.UNSPECIFIED
            link.target.type = Terminus.UNSPECIFIED
            link.open()
        link.condition = Condition(condition, description)
        link.close()
        ctx = self._ctx(link)
        if ctx is not None and ctx.consumer is not None:
            self.broker.detach(ctx.consumer)
            ctx.consumer = None

    def _on_link_remote_open(self, ev: Event) -> None:
        link = ev.link
        if not link.state & Endpoint.LOCAL_UNINIT:
            return
        c = self.by_connection.get(link.connection)
        if c is not None:
            c.links.append(link)
        if link.is_sender:
            address = link.remote_source.address
        else:
            address = link.remote_target.address
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        path = entity_path(address)
        lower = path.lower()
        if lower == "$cbs":
            entity = None
            kind_node = "$cbs"
        elif lower.endswith("/$management"):
            entity = self.broker.find_entity(path[: -len("/$management")])
            kind_node = lower
            if entity is None:
                self.refuse(link, "amqp:not-found",
                            f"The messaging entity '{path[: -len('/$management')]}' could not be found.")
                return
        else:
            entity = self.broker.find_entity(path)
            kind_node = ""
            if entity is None:
                self.refuse(link, "amqp:not-found", f"The messaging entity '{path}' could not be found.")
                return
        if link.is_receiver:
            # the client sends: messages to an entity, or requests to $cbs / $management
            ctx = self._register(LinkCtx("request" if kind_node else "send", link, entity, kind_node))
            if ctx.kind == "send":
                if entity is not None and entity.is_dlq:
                    self.refuse(link, "amqp:not-allowed", "Cannot send to a dead-letter queue.")
                    return
                link.max_message_size = MAX_MESSAGE_SIZE
            link.open()
            if ctx.kind == "send":
                link.flow(SEND_CREDIT)
            # Request links: pyamqp sends requests on its own credit. Ours is granted with the
            # deferred settlement (see _settle_deferred), which keeps a frame out of the
            # client's link-opening poll loop.
            return
        # the client receives
        if kind_node:
            self._register(LinkCtx("reply", link, entity, kind_node))
            link.open()
            return
        assert entity is not None
        ctx = self._register(LinkCtx("receive", link, entity))
        sink = LinkSink(link, self)
        ctx.sink = sink
        rad = link.remote_snd_settle_mode == Link.SND_SETTLED
        session_filter: Any = False
        filt = _read_filter(link)
        if filt is not None and SESSION_FILTER in filt:
            session_filter = filt[SESSION_FILTER]
            if session_filter is not None:
                session_filter = str(session_filter)
        if session_filter is not False and not entity.requires_session:
            self.refuse(link, "amqp:not-allowed",
                        f"It is not possible for an entity that does not require sessions to create a "
                        f"session receiver ('{entity.name}').")
            return
        if session_filter is False and entity.requires_session:
            self.refuse(link, "amqp:not-allowed",
                        f"It is not possible for an entity that requires sessions to create a non-sessionful "
                        f"message receiver ('{entity.name}').")
            return
        wait_ms = 60_000
        props = _remote_properties(link)
        if props:
            for k, v in props.items():
                if str(k) == OPERATION_TIMEOUT and isinstance(v, int):
                    wait_ms = int(v)
        if not entity.requires_session:
            sink.opened = True
            link.open()
        try:
            consumer = self.broker.attach(entity, sink, rad, session_filter, wait_ms)
        except BrokerError as e:
            self.refuse(link, e.condition, e.description)
            return
        ctx.consumer = consumer
        sink.consumer = consumer

    def _on_raw_flow(self, ev: Any) -> None:
        link = _lib.pn_event_link(ev)
        if link == _NULL or not _lib.pn_link_is_sender(link):
            return
        ctx = self.ctxs.get(_ptr(link))
        if ctx is None or ctx.consumer is None:
            return
        ctx.consumer.entity.ops["flows"] += 1  # credit granted: counted apart, not an operation
        self.broker.credit_changed(ctx.consumer)
        if _lib.pn_link_get_drain(link):
            self.drain_links.add(ctx.link)

    def _on_link_remote_close(self, ev: Event) -> None:
        link = ev.link
        ctx = self._ctx(link)
        if ctx is not None and ctx.consumer is not None:
            self.broker.detach(ctx.consumer)
            ctx.consumer = None
        if not link.state & Endpoint.LOCAL_CLOSED:
            link.close()
        self.ctxs.pop(_ptr(link._impl), None)
        c = self.by_connection.get(link.connection)
        if c is not None:
            try:
                c.links.remove(link)
            except ValueError:
                pass

    # ============================================================ deliveries
    def _on_raw_delivery(self, ev: Any) -> None:
        d = _lib.pn_event_delivery(ev)
        link = _lib.pn_delivery_link(d)
        if not _lib.pn_link_is_sender(link):
            # a transfer from the client (a send or a management request): the slower, general path
            self._on_delivery(Event.wrap(ev))
            return
        state = _lib.pn_delivery_remote_state(d)
        remote_settled = _lib.pn_delivery_settled(d)  # proton: "settled" is the remote peer's settlement
        if not state and not remote_settled:
            return
        ctx = self.ctxs.get(_ptr(link))
        if ctx is None or ctx.kind != "receive" or state == _REJECTED:
            # dead-letter carries an error with info: read it through the wrappers
            self._on_disposition(Delivery.wrap(d) if ctx is not None else None, ctx, d)
            return
        t = _lib.pn_delivery_tag(d)
        tag = bytes(_ffi.buffer(t.start, t.size))
        broker = self.broker
        failed = undeliverable = False
        try:
            if state == _ACCEPTED:
                broker.complete(tag)
            elif state == _MODIFIED:
                rem = _lib.pn_delivery_remote(d)
                failed = bool(_lib.pn_disposition_is_failed(rem))
                undeliverable = bool(_lib.pn_disposition_is_undeliverable(rem))
                if undeliverable:
                    broker.defer(tag)
                elif failed:
                    broker.abandon(tag)
                else:
                    broker.release(tag)
            else:  # released, or settled without an outcome
                broker.release(tag)
        except BrokerError as e:
            if not remote_settled:
                dw = Delivery.wrap(d)
                dw.local.condition = Condition(e.condition, e.description)
                dw.update(Delivery.REJECTED)
            _lib.pn_delivery_settle(d)
            return
        if not remote_settled and state:
            if state == _MODIFIED:
                loc = _lib.pn_delivery_local(d)
                _lib.pn_disposition_set_failed(loc, failed)
                _lib.pn_disposition_set_undeliverable(loc, undeliverable)
            _lib.pn_delivery_update(d, state)
        _lib.pn_delivery_settle(d)

    def _on_delivery(self, ev: Event) -> None:
        d = ev.delivery
        link = d.link
        if d.aborted:
            d.settle()
            return
        if not d.readable or d.partial:
            return
        data = link.recv(d.pending)
        link.advance()
        ctx = self._ctx(link)
        if ctx is None:
            d.settle()
            return
        if ctx.kind == "send":
            self._on_send(link, d, ctx, data)
            if link.credit < SEND_CREDIT // 2:
                link.flow(SEND_CREDIT - link.credit)
            return
        c = self.by_connection.get(link.connection)
        if c is not None:
            if not c.deferred:
                c.deferred_at = time.time()
            c.deferred.append(d)
        else:
            d.update(Delivery.ACCEPTED)
            d.settle()
        self._on_request(link, ctx, data)

    def _on_send(self, link: Link, d: Delivery, ctx: LinkCtx, data: bytes) -> None:
        assert ctx.entity is not None
        try:
            raws = codec.split_batch(data)
            if raws is None:
                raws = [data]
            # The limit is per message; a batch envelope adds a few bytes of its own.
            if len(data) > MAX_MESSAGE_SIZE + 4096 or any(len(r) > MAX_MESSAGE_SIZE for r in raws):
                raise BrokerError(
                    "amqp:link:message-size-exceeded",
                    f"The received message (size {len(data)} bytes) exceeds the limit ({MAX_MESSAGE_SIZE} bytes) "
                    f"currently allowed on the link.")
            self.broker.send(ctx.entity, raws)
            d.update(Delivery.ACCEPTED)
        except BrokerError as e:
            d.local.condition = _error(e.condition, e.description)
            d.update(Delivery.REJECTED)
        except (codec.CodecError, IndexError, ValueError) as e:
            d.local.condition = _error("amqp:decode-error", f"Cannot decode the message: {e}")
            d.update(Delivery.REJECTED)
        d.settle()

    def _on_disposition(self, d: Delivery | None, ctx: LinkCtx | None, raw: Any) -> None:
        if d is None or ctx is None or ctx.kind != "receive":
            _lib.pn_delivery_settle(raw)
            return
        state = d.remote_state
        remote_settled = d.settled  # proton: "settled" is the remote peer's settlement
        tag = _delivery_tag(d)
        broker = self.broker
        error: BrokerError | None = None
        remote = d.remote
        try:
            if state == Delivery.ACCEPTED:
                broker.complete(tag)
            elif state == Delivery.REJECTED:
                reason = description = None
                cond = remote.condition
                if cond is not None:
                    info = cond.info or {}
                    for k, v in dict(info).items():
                        ks = str(k)
                        if ks == "DeadLetterReason":
                            reason = None if v is None else str(v)
                        elif ks == "DeadLetterErrorDescription":
                            description = None if v is None else str(v)
                    if description is None and cond.description:
                        description = cond.description
                broker.dead_letter(tag, reason, description)
            elif state == Delivery.MODIFIED:
                if remote.undeliverable:
                    broker.defer(tag)
                elif remote.failed:
                    broker.abandon(tag)
                else:
                    broker.release(tag)
            elif state == Delivery.RELEASED or (remote_settled and not state):
                broker.release(tag)
        except BrokerError as e:
            error = e
        if not remote_settled:
            if error is not None:
                d.local.condition = Condition(error.condition, error.description)
                d.update(Delivery.REJECTED)
            else:
                if state == Delivery.MODIFIED:
                    d.local.failed = bool(remote.failed)
                    d.local.undeliverable = bool(remote.undeliverable)
                d.update(state)
        d.settle()

    # ============================================================ $cbs and $management
    def _on_request(self, link: Link, ctx: LinkCtx, data: bytes) -> None:
        req = Message()
        try:
            req.decode(data)
        except Exception as e:  # noqa: BLE001
            log.warning("undecodable management request: %s", e)
            return
        props = req.properties or {}
        if ctx.node == "$cbs":
            reply = Message(body=None, correlation_id=req.id,
                            properties={"status-code": 202, "status-description": "Accepted"})
        else:
            reply = self._management(ctx, req, props)
        reply.correlation_id = req.id if req.id is not None else req.correlation_id
        if req.reply_to:
            reply.address = req.reply_to
        target = self._reply_link(link, ctx.node, req.reply_to)
        if target is None:
            log.warning("no reply link for %s (reply-to %r)", ctx.node, req.reply_to)
            return
        tag = uuid.uuid4().bytes
        dlv = target.delivery(tag)
        target.stream(reply.encode())
        target.advance()
        dlv.settle()

    def _reply_link(self, request_link: Link, node: str, reply_to: str | None) -> Link | None:
        c = self.by_connection.get(request_link.connection)
        if c is None:
            return None
        ssn = request_link.session
        fallback = None
        for link in c.links:
            if not link.is_sender or link.state & Endpoint.LOCAL_CLOSED:
                continue
            ctx = self._ctx(link)
            if ctx is None or ctx.kind != "reply":
                continue
            if ctx.node == node:
                if link.session == ssn:
                    return link
                fallback = fallback or link
            elif reply_to and entity_path(link.remote_target.address) == entity_path(reply_to):
                fallback = fallback or link
        return fallback

    def _management(self, ctx: LinkCtx, req: Message, props: dict) -> Message:
        op = str(props.get("operation") or "")
        body = req.body if isinstance(req.body, dict) else {}
        body = {str(k): _plain(v) for k, v in body.items()}
        entity = ctx.entity
        assert entity is not None
        self.broker.count_management(entity, op.removeprefix("com.microsoft:"))
        try:
            status, out = self._operation(op, entity, body)
            desc = "OK" if status == 200 else "No Content"
            app = {"statusCode": status, "statusDescription": desc}
        except BrokerError as e:
            out = None
            app = {"statusCode": e.status, "statusDescription": e.description,
                   "errorCondition": symbol(e.condition)}
        except Exception as e:  # noqa: BLE001
            log.exception("management operation %s failed", op)
            out = None
            app = {"statusCode": 500, "statusDescription": str(e),
                   "errorCondition": symbol("amqp:internal-error")}
        return Message(body=out, properties=app)

    def _operation(self, op: str, entity: Entity, body: dict) -> tuple[int, Any]:
        b = self.broker
        if op == "com.microsoft:renew-lock":
            tokens = [_token(t) for t in body.get("lock-tokens") or []]
            exps = [timestamp(b.renew_lock(t)) for t in tokens]
            return 200, {"expirations": Array(_UNDESCRIBED, Data.TIMESTAMP, *exps)}
        if op == "com.microsoft:peek-message":
            start = int(body.get("from-sequence-number") or 1)
            count = int(body.get("message-count") or 1)
            sid = body.get("session-id")
            msgs = b.peek(entity, start, count, str(sid) if sid is not None else None)
            if not msgs:
                return 204, None
            return 200, {"messages": [{"message": m.encode(None, with_state=True)} for m in msgs]}
        if op == "com.microsoft:receive-by-sequence-number":
            seqs = [int(s) for s in body.get("sequence-numbers") or []]
            mode = int(body.get("receiver-settle-mode") or 0)
            sid = body.get("session-id")
            got = b.receive_deferred(entity, seqs, receive_and_delete=(mode == 0),
                                     session_id=str(sid) if sid is not None else None)
            return 200, {"messages": [{"message": payload, "lock-token": uuid.UUID(bytes_le=token)}
                                      for _m, token, payload in got]}
        if op == "com.microsoft:update-disposition":
            status = str(body.get("disposition-status") or "")
            tokens = [_token(t) for t in body.get("lock-tokens") or []]
            reason = body.get("deadletter-reason")
            desc = body.get("deadletter-description")
            for t in tokens:
                b.settle(t, status, reason, desc)
            return 200, {}
        if op == "com.microsoft:schedule-message":
            raws = []
            for item in body.get("messages") or []:
                item = {str(k): v for k, v in dict(item).items()}
                raws.append(bytes(item["message"]))
            seqs = b.schedule(entity, raws)
            return 200, {"sequence-numbers": Array(_UNDESCRIBED, Data.LONG, *seqs)}
        if op == "com.microsoft:cancel-scheduled-message":
            b.cancel_scheduled(entity, [int(s) for s in body.get("sequence-numbers") or []])
            return 200, {}
        if op == "com.microsoft:renew-session-lock":
            exp = b.renew_session_lock(entity, str(body.get("session-id")))
            return 200, {"expiration": timestamp(exp)}
        if op == "com.microsoft:get-session-state":
            state = b.get_session_state(entity, str(body.get("session-id")))
            return 200, {"session-state": state}
        if op == "com.microsoft:set-session-state":
            st = body.get("session-state")
            b.set_session_state(entity, str(body.get("session-id")), None if st is None else bytes(st))
            return 200, {}
        if op == "com.microsoft:get-message-sessions":
            sids = b.list_sessions(entity)
            if not sids:
                return 204, None
            return 200, {"skip": 0, "sessions-ids": Array(_UNDESCRIBED, Data.STRING, *sids)}
        raise BrokerError("amqp:not-implemented", f"Operation {op!r} is not supported by the emulator.", 501)


def _error(condition: str, description: str) -> Condition:
    """An error for a rejected outcome. pyamqp's sender reads the error's info field by index,
    so the info map must be on the wire (proton drops a null trailing field)."""
    return Condition(condition, description, {symbol("com.microsoft:tracking-id"): str(uuid.uuid4())})


def _delivery_tag(d: Delivery) -> bytes:
    # proton's Delivery.tag decodes the tag as UTF-8; lock tokens are arbitrary bytes.
    t = _lib.pn_delivery_tag(d._impl)
    return bytes(_ffi.unpack(t.start, t.size))


def _plain(v: Any) -> Any:
    if isinstance(v, Array):
        return list(v.elements)
    return v


def _token(t: Any) -> bytes:
    if isinstance(t, uuid.UUID):
        return t.bytes_le
    if isinstance(t, (bytes, bytearray)) and len(t) == 16:
        return bytes(t)
    return uuid.UUID(str(t)).bytes_le


def _read_filter(link: Link) -> dict | None:
    try:
        f = link.remote_source.filter
        f.rewind()
        if not f.next():
            return None
        obj = f.get_object()
        return obj if isinstance(obj, dict) else None
    except Exception:  # noqa: BLE001
        return None


def _remote_properties(link: Link) -> dict | None:
    try:
        props = link.remote_properties
        return dict(props) if props else None
    except Exception:  # noqa: BLE001
        return None


__all__ = ["Server", "entity_path"]
