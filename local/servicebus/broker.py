"""Queue semantics of the emulator, in pure Python (no AMQP): testable on its own.

The broker keeps every entity's messages in memory (indexes: a heap of available sequence
numbers, per-session heaps, a lock table, timer heaps for lock expiry, scheduled enqueue
and time-to-live) and records each change in the write-behind :class:`~.store.Store`, which
the server commits once per reactor tick before anything of that tick is acknowledged.

Messages are kept as the bytes the sender encoded (see :mod:`.codec`); on delivery the
broker writes its own header (delivery-count) and message annotations (sequence number,
enqueued time, locked-until) in front of the untouched properties, application-properties
and body.

Consumers are given to the broker by the server as objects with a ``sink`` that can
``credit()``, ``deliver(payload, tag, settled)``, and is told about session assignment,
session timeouts and lost session locks. Tests use a fake sink.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import struct
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Protocol

from . import codec
from .config import NEVER_MS, EmulatorConfig, QueueConfig
from .store import Store

log = logging.getLogger("servicebus.broker")

# Persisted message states (same numbers as the SDK's ServiceBusMessageState).
ACTIVE = 0
DEFERRED = 1
SCHEDULED = 2

# In-memory status
AVAILABLE = 0
LOCKED = 1
ST_DEFERRED = 2
ST_SCHEDULED = 3
GONE = 4

DLQ_SUFFIX = "/$deadletterqueue"

MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
TTL_REASON = "TTLExpiredException"

_K_SEQ = codec.enc_symbol("x-opt-sequence-number")
_K_ENQ = codec.enc_symbol("x-opt-enqueued-time")
_K_LOCKED = codec.enc_symbol("x-opt-locked-until")
_K_STATE = codec.enc_symbol("x-opt-message-state")
_K_SCHED = "x-opt-scheduled-enqueue-time"
_BROKER_KEYS = {"x-opt-sequence-number", "x-opt-enqueued-time", "x-opt-locked-until", "x-opt-lock-token",
                "x-opt-message-state", "x-opt-enqueue-sequence-number"}
_I64 = struct.Struct(">q")
_ANN_HDR = b"\x00\x53\x72"


class BrokerError(Exception):
    """An error with a Service Bus condition, for the server to put on the wire."""

    def __init__(self, condition: str, description: str, status: int = 400) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description
        self.status = status


def lock_lost(description: str = "The lock supplied is invalid. Either the lock expired, or the message has "
                                 "already been removed from the queue.") -> BrokerError:
    return BrokerError("com.microsoft:message-lock-lost", description, 410)


def session_lock_lost(description: str = "The session lock has expired on the session.") -> BrokerError:
    return BrokerError("com.microsoft:session-lock-lost", description, 410)


def not_found(description: str) -> BrokerError:
    return BrokerError("amqp:not-found", description, 404)


def now_ms() -> int:
    return int(time.time() * 1000)


class Sink(Protocol):
    def credit(self) -> int: ...
    def deliver(self, payload: bytes, tag: bytes, settled: bool) -> Any: ...
    def session_assigned(self, session_id: str, locked_until_ms: int) -> None: ...
    def session_wait_timeout(self) -> None: ...
    def session_lost(self) -> None: ...


class Parsed:
    """What the broker needs to know of an encoded message."""

    __slots__ = ("durable", "priority", "ttl", "first_acq", "ann_inner", "ann_count", "scheduled_ms",
                 "message_id", "session_id", "rest_off")

    def __init__(self, raw: bytes) -> None:
        self.durable = self.priority = self.ttl = self.first_acq = None
        self.ann_inner = b""
        self.ann_count = 0
        self.scheduled_ms: int | None = None
        self.message_id: Any = None
        self.session_id: str | None = None
        self.rest_off = len(raw)
        rest_set = False
        for code, sstart, vstart, _vend in codec.iter_sections(raw):
            if code == codec.HEADER:
                fields, _ = codec.decode(raw, vstart)
                fields = (list(fields) + [None] * 5)[:5]
                self.durable, self.priority, self.ttl, self.first_acq = fields[0], fields[1], fields[2], fields[3]
            elif code == codec.MESSAGE_ANNOTATIONS:
                count, p, end = codec.compound_inner(raw, vstart)
                inner = raw[p:end]
                if b"x-opt-" in inner:
                    kept = []
                    for key, entry in codec.map_entries(raw, vstart):
                        if key == _K_SCHED:
                            v, _ = codec.decode(entry, codec.skip(entry, 0))
                            if isinstance(v, int) and v > 0:
                                self.scheduled_ms = int(v)
                        if key in _BROKER_KEYS:
                            continue
                        kept.append(entry)
                    self.ann_inner = b"".join(kept)
                    self.ann_count = 2 * len(kept)
                else:
                    self.ann_inner = bytes(inner)
                    self.ann_count = count
            elif code >= codec.PROPERTIES and not rest_set:
                self.rest_off = sstart
                rest_set = True
                if code == codec.PROPERTIES:
                    # only message-id (field 0) and group-id (field 10, the session id) are needed
                    count, p, _end = codec.compound_inner(raw, vstart)
                    if count > 0:
                        self.message_id, p = codec.decode(raw, p)
                        if count > 10:
                            for _ in range(9):
                                p = codec.skip(raw, p)
                            gid, p = codec.decode(raw, p)
                            if gid is not None:
                                self.session_id = str(gid)


def message_id_key(mid: Any) -> str | None:
    if mid is None:
        return None
    if isinstance(mid, str):
        return mid
    if isinstance(mid, uuid.UUID):
        return "uuid:" + str(mid)
    if isinstance(mid, bytes):
        return "bin:" + mid.hex()
    return f"{type(mid).__name__}:{mid}"


class Msg:
    __slots__ = ("uid", "entity", "seq", "raw", "p", "enqueued_ms", "expires_ms", "scheduled_ms", "dc", "state",
                 "status", "lock_token", "locked_until", "consumer", "session_id")

    def __init__(self, uid: int, entity: Entity, seq: int, raw: bytes, p: Parsed, enqueued_ms: int) -> None:
        self.uid = uid
        self.entity = entity
        self.seq = seq
        self.raw = raw
        self.p = p
        self.enqueued_ms = enqueued_ms
        self.expires_ms: int | None = None
        self.scheduled_ms: int | None = None
        self.dc = 0
        self.state = ACTIVE
        self.status = AVAILABLE
        self.lock_token: bytes | None = None
        self.locked_until = 0
        self.consumer: Consumer | None = None
        self.session_id = p.session_id

    def encode(self, locked_until_ms: int | None = None, with_state: bool = False) -> bytes:
        """The message as delivered: broker header + annotations, then the sender's sections."""
        p = self.p
        ttl = p.ttl
        if ttl is None and self.expires_ms is not None:
            eff = self.expires_ms - self.enqueued_ms
            if 0 < eff <= 0xFFFFFFFF:
                ttl = eff
        header = codec.encode_header(p.durable, p.priority, ttl, p.first_acq, self.dc)
        ann = [p.ann_inner, _K_SEQ, b"\x81", _I64.pack(self.seq), _K_ENQ, b"\x83", _I64.pack(self.enqueued_ms)]
        count = p.ann_count + 4
        if locked_until_ms is not None:
            ann += [_K_LOCKED, b"\x83", _I64.pack(locked_until_ms)]
            count += 2
        if with_state:
            ann += [_K_STATE, codec.enc_long(self.state)]
            count += 2
        inner = b"".join(ann)
        raw = self.raw
        return b"".join((header, _ANN_HDR, codec.enc_map_raw(inner, count),
                         memoryview(raw)[p.rest_off:] if p.rest_off < len(raw) else b""))


class Session:
    __slots__ = ("entity", "sid", "heap", "owner", "lock_until", "locked")

    def __init__(self, entity: Entity, sid: str) -> None:
        self.entity = entity
        self.sid = sid
        self.heap: list[int] = []
        self.owner: Consumer | None = None
        self.lock_until = 0
        self.locked: set[int] = set()  # uids locked under this session


class Consumer:
    """One receiving link (or a management-only lock holder when sink is None)."""

    __slots__ = ("entity", "sink", "rad", "session", "closed", "waiting_deadline", "__weakref__")

    def __init__(self, entity: Entity, sink: Any, receive_and_delete: bool) -> None:
        self.entity = entity
        self.sink = sink
        self.rad = receive_and_delete
        self.session: Session | None = None
        self.closed = False
        self.waiting_deadline: int | None = None


class Entity:
    def __init__(self, name: str, cfg: QueueConfig, is_dlq: bool = False) -> None:
        self.name = name  # canonical, as declared ("orders" or "orders/$DeadLetterQueue")
        self.cfg = cfg
        self.is_dlq = is_dlq
        self.dlq: Entity | None = None
        self.msgs: dict[int, Msg] = {}
        self.avail: list[int] = []
        self.consumers: list[Consumer] = []
        self.next_seq = 1
        self.dups: OrderedDict[str, int] = OrderedDict()
        self.sessions: dict[str, Session] = {}
        self.session_states: dict[str, bytes] = {}
        self.session_waiters: list[Consumer] = []
        self.requires_session = cfg.requires_session and not is_dlq
        self.lock_ms = cfg.lock_duration_ms
        self.max_dc = cfg.max_delivery_count if not is_dlq else 1 << 62
        self.ttl_ms = cfg.default_ttl_ms if not is_dlq else NEVER_MS
        # operation counters (benchmarks; written by --stats-file): messages accepted by sends,
        # deliveries (a message transferred to a receiver; credit alone is not an operation),
        # settlements, management operations by name, duplicates dropped, expirations
        self.ops: dict[str, Any] = {"sent": 0, "delivered": 0, "completed": 0, "abandoned": 0,
                                    "deadlettered": 0, "deferred": 0, "released": 0, "lock_expired": 0,
                                    "duplicates": 0, "expired": 0, "flows": 0, "management": {}}

    def session(self, sid: str) -> Session:
        s = self.sessions.get(sid)
        if s is None:
            s = self.sessions[sid] = Session(self, sid)
        return s


class Broker:
    def __init__(self, config: EmulatorConfig, store: Store | None) -> None:
        self.store = store
        self.entities: dict[str, Entity] = {}
        for qc in config.queues:
            e = Entity(qc.name, qc)
            d = Entity(qc.name + "/$DeadLetterQueue", qc, is_dlq=True)
            e.dlq = d
            self.entities[qc.name.lower()] = e
            self.entities[d.name.lower()] = d
        self.by_uid: dict[int, Msg] = {}
        self.locks: dict[bytes, Msg] = {}
        self.lock_heap: list[tuple[int, int, bytes]] = []
        self.ttl_heap: list[tuple[int, int]] = []
        self.sched_heap: list[tuple[int, int]] = []
        self.session_heap: list[tuple[int, int, Session | Consumer]] = []
        self.dirty: set[Entity] = set()
        self.dirty_sessions: set[Session] = set()
        self.next_uid = 1
        self._tok_prefix = os.urandom(8)
        self._tok_counter = itertools.count(1)
        self._heap_counter = itertools.count()
        self._last_dup_prune = 0
        self.stats = {"sent": 0, "delivered": 0, "completed": 0, "dead_lettered": 0, "duplicates": 0}
        if store is not None:
            self._load()

    # ================================================================ persistence
    def _load(self) -> None:
        assert self.store is not None
        meta = self.store.load_meta()
        self.next_uid = meta.get("next_uid", 1)
        for ent in self.entities.values():
            ent.next_seq = meta.get("seq:" + ent.name.lower(), 1)
        now = now_ms()
        for uid, ename, seq, state, dc, enq, exp, sched, raw in self.store.load_messages():
            e = self.entities.get(ename.lower())
            if e is None:
                continue  # entity no longer declared: left in the database untouched
            raw = bytes(raw)
            m = Msg(uid, e, seq, raw, Parsed(raw), enq)
            m.dc = dc
            m.state = state
            m.expires_ms = exp
            m.scheduled_ms = sched
            e.msgs[seq] = m
            self.by_uid[uid] = m
            self.next_uid = max(self.next_uid, uid + 1)
            if not e.is_dlq:
                e.next_seq = max(e.next_seq, seq + 1)
            if state == SCHEDULED:
                m.status = ST_SCHEDULED
                heapq.heappush(self.sched_heap, (sched or now, uid))
            elif state == DEFERRED:
                m.status = ST_DEFERRED
                self._track_ttl(m)
            else:
                self._make_available(m, now, persist=False)
        for ename, mid, seen in self.store.load_dups(now):
            de = self.entities.get(ename.lower())
            if de is not None and seen > now - de.cfg.duplicate_window_ms:
                de.dups[mid] = seen
        for ename, sid, sstate in self.store.load_session_states():
            se = self.entities.get(ename.lower())
            if se is not None and sstate is not None:
                se.session_states[sid] = bytes(sstate)

    def commit(self) -> None:
        if self.store is not None:
            self.store.commit()

    # ================================================================ lookup
    def entity(self, name: str) -> Entity:
        e = self.entities.get(name.strip("/").lower())
        if e is None:
            raise not_found(f"The messaging entity '{name}' could not be found.")
        return e

    def find_entity(self, name: str) -> Entity | None:
        return self.entities.get(name.strip("/").lower())

    # ================================================================ sending
    def send(self, entity: Entity, raws: Iterable[bytes], now: int | None = None) -> list[int | None]:
        """Enqueue encoded messages; returns their sequence numbers (None for a dropped duplicate)."""
        if entity.is_dlq:
            raise BrokerError("amqp:not-allowed", "Cannot send to a dead-letter queue.", 400)
        now = now or now_ms()
        parsed = [(bytes(r), Parsed(r)) for r in raws]  # parse all first: a bad one fails the whole transfer
        if entity.requires_session:
            for _raw, p in parsed:
                if p.session_id is None:
                    raise BrokerError(
                        "amqp:not-allowed",
                        f"The SessionId was not set on a message, and it cannot be sent to the entity "
                        f"'{entity.name}'. Entities that have session support enabled can only receive messages "
                        f"that have a non-null SessionId.", 400)
        out: list[int | None] = []
        for raw, p in parsed:
            out.append(self._enqueue(entity, raw, p, now))
        return out

    def _enqueue(self, e: Entity, raw: bytes, p: Parsed, now: int) -> int | None:
        cfg = e.cfg
        if cfg.requires_duplicate_detection:
            key = message_id_key(p.message_id)
            if key is not None:
                seen = e.dups.get(key)
                if seen is not None and seen > now - cfg.duplicate_window_ms:
                    self.stats["duplicates"] += 1
                    e.ops["duplicates"] += 1
                    return None
                e.dups[key] = now
                e.dups.move_to_end(key)
                if self.store is not None:
                    self.store.add_dup(e.name, key, now)
        uid = self.next_uid
        self.next_uid += 1
        seq = e.next_seq
        e.next_seq += 1
        m = Msg(uid, e, seq, raw, p, now)
        e.msgs[seq] = m
        self.by_uid[uid] = m
        self.stats["sent"] += 1
        e.ops["sent"] += 1
        if p.scheduled_ms is not None and p.scheduled_ms > now:
            m.state = SCHEDULED
            m.status = ST_SCHEDULED
            m.scheduled_ms = p.scheduled_ms
            m.enqueued_ms = p.scheduled_ms
            heapq.heappush(self.sched_heap, (p.scheduled_ms, uid))
            self._persist_new(m)
            return seq
        self._set_expiry(m)
        self._persist_new(m)
        self._make_available(m, now, persist=False)
        return seq

    def _set_expiry(self, m: Msg) -> None:
        ttl = m.entity.ttl_ms
        if m.p.ttl is not None and m.p.ttl > 0:
            ttl = min(ttl, m.p.ttl)
        m.expires_ms = m.enqueued_ms + ttl if ttl < NEVER_MS else None

    def _persist_new(self, m: Msg) -> None:
        if self.store is not None:
            self.store.insert(m)
            self.store.set_meta("next_uid", self.next_uid)
            self.store.set_meta("seq:" + m.entity.name.lower(), m.entity.next_seq)

    def _track_ttl(self, m: Msg) -> None:
        if m.expires_ms is not None:
            heapq.heappush(self.ttl_heap, (m.expires_ms, m.uid))

    def _make_available(self, m: Msg, now: int, persist: bool = True) -> None:
        """Put a message (back) among the deliverable ones."""
        e = m.entity
        m.status = AVAILABLE
        m.lock_token = None
        m.consumer = None
        if m.expires_ms is not None:
            if m.expires_ms <= now:
                self._expire(m, now)
                return
            heapq.heappush(self.ttl_heap, (m.expires_ms, m.uid))
        if m.session_id is not None and e.requires_session:
            s = e.session(m.session_id)
            heapq.heappush(s.heap, m.seq)
            if s.owner is not None:
                self.dirty_sessions.add(s)
            elif e.session_waiters:
                self.dirty.add(e)
        else:
            heapq.heappush(e.avail, m.seq)
            if e.consumers:
                self.dirty.add(e)
        if persist and self.store is not None:
            self.store.update(m)

    # ================================================================ removal / dead-letter
    def _remove(self, m: Msg) -> None:
        m.status = GONE
        e = m.entity
        e.msgs.pop(m.seq, None)
        self.by_uid.pop(m.uid, None)
        if m.lock_token is not None:
            self.locks.pop(m.lock_token, None)
            m.lock_token = None
        if self.store is not None:
            self.store.delete(m)

    def _expire(self, m: Msg, now: int) -> None:
        m.entity.ops["expired"] += 1
        if m.entity.cfg.dead_lettering_on_expiration and not m.entity.is_dlq:
            self._dead_letter(m, TTL_REASON, "The message expired and was dead lettered.")
        else:
            self._remove(m)

    def _dead_letter(self, m: Msg, reason: str | None, description: str | None) -> None:
        src = m.entity
        dlq = src.dlq
        if dlq is None:  # already in a DLQ: Service Bus keeps it there
            self._make_available(m, now_ms())
            return
        src.msgs.pop(m.seq, None)
        if m.lock_token is not None:
            self.locks.pop(m.lock_token, None)
            m.lock_token = None
        if m.session_id is not None and src.requires_session:
            s = src.sessions.get(m.session_id)
            if s is not None:
                s.locked.discard(m.uid)
        props: list[tuple[str, str]] = []
        if reason is not None:
            props.append(("DeadLetterReason", str(reason)))
        if description is not None:
            props.append(("DeadLetterErrorDescription", str(description)))
        raw = set_application_properties(m.raw, props)
        m.raw = raw
        m.p = Parsed(raw)
        m.entity = dlq
        m.state = ACTIVE
        m.expires_ms = None
        m.scheduled_ms = None
        m.consumer = None
        while m.seq in dlq.msgs:  # cannot collide in practice; keep the DLQ index consistent anyway
            m.seq += 1 << 40
        dlq.msgs[m.seq] = m
        self.stats["dead_lettered"] += 1
        if self.store is not None:
            self.store.update(m, full=True)
        self._make_available(m, now_ms(), persist=False)

    # ================================================================ consumers
    def attach(self, entity: Entity, sink: Any, receive_and_delete: bool,
               session_filter: Any = False, wait_ms: int = 60_000, now: int | None = None) -> Consumer:
        """Attach a receiving link. ``session_filter``: False (no session), None (next available) or an id.

        For a session entity the sink is told ``session_assigned`` (possibly later, when a session
        becomes available) or ``session_wait_timeout``.
        """
        now = now or now_ms()
        c = Consumer(entity, sink, receive_and_delete)
        if entity.requires_session:
            if session_filter is False:
                session_filter = None
            if session_filter is not None:
                s = entity.session(str(session_filter))
                if s.owner is not None and not s.owner.closed:
                    raise BrokerError("com.microsoft:session-cannot-be-locked",
                                      f"The requested session '{session_filter}' cannot be accepted. "
                                      f"It may be locked by another receiver.", 410)
                self._lock_session(c, s, now)
            else:
                s2 = self._pick_session(entity)
                if s2 is not None:
                    self._lock_session(c, s2, now)
                else:
                    c.waiting_deadline = now + max(wait_ms, 0)
                    entity.session_waiters.append(c)
                    heapq.heappush(self.session_heap, (c.waiting_deadline, next(self._heap_counter), c))
            return c
        entity.consumers.append(c)
        if entity.avail:
            self.dirty.add(entity)
        return c

    def _pick_session(self, e: Entity) -> Session | None:
        best = None
        for s in e.sessions.values():
            if (s.owner is None or s.owner.closed) and s.heap:
                if best is None or s.heap[0] < best.heap[0]:
                    best = s
        return best

    def _lock_session(self, c: Consumer, s: Session, now: int) -> None:
        s.owner = c
        s.lock_until = now + s.entity.lock_ms
        c.session = s
        heapq.heappush(self.session_heap, (s.lock_until, next(self._heap_counter), s))
        if c.sink is not None:
            c.sink.session_assigned(s.sid, s.lock_until)
        if s.heap:
            self.dirty_sessions.add(s)

    def credit_changed(self, c: Consumer) -> None:
        if c.session is not None:
            if c.session.heap:
                self.dirty_sessions.add(c.session)
        elif c.entity.avail and not c.entity.requires_session:
            self.dirty.add(c.entity)

    def detach(self, c: Consumer, now: int | None = None) -> None:
        """The link is gone. Message locks stay until they expire (as in Service Bus); a
        session lock is released at once, and the session's locked messages become available."""
        if c.closed:
            return
        c.closed = True
        log.debug("detach consumer on %s (session %s)", c.entity.name, c.session.sid if c.session else None)
        now = now or now_ms()
        e = c.entity
        if c in e.consumers:
            e.consumers.remove(c)
        if c in e.session_waiters:
            e.session_waiters.remove(c)
        s = c.session
        if s is not None and s.owner is c:
            self._release_session(s, now, increment=False)

    def _release_session(self, s: Session, now: int, increment: bool) -> None:
        log.debug("release session %s/%s (lock expired: %s)", s.entity.name, s.sid, increment)
        s.owner = None
        s.lock_until = 0
        for uid in list(s.locked):
            m = self.by_uid.get(uid)
            if m is not None and m.status == LOCKED:
                if m.lock_token is not None:
                    self.locks.pop(m.lock_token, None)
                if increment:
                    self._failed_delivery(m, now)
                else:
                    self._make_available(m, now)
        s.locked.clear()
        if s.heap and s.entity.session_waiters:
            self.dirty.add(s.entity)
        self._maybe_drop_session(s)

    def _maybe_drop_session(self, s: Session) -> None:
        if s.owner is None and not s.heap and not s.locked:
            s.entity.sessions.pop(s.sid, None)

    # ================================================================ delivery
    def _new_token(self) -> bytes:
        return self._tok_prefix + next(self._tok_counter).to_bytes(8, "little")

    def pump(self, now: int | None = None) -> int:
        """Deliver available messages to consumers with credit. Returns the number delivered."""
        if not self.dirty and not self.dirty_sessions:
            return 0
        now = now or now_ms()
        n = 0
        if self.dirty:
            dirty, self.dirty = self.dirty, set()
            for e in dirty:
                if e.requires_session:
                    self._assign_waiters(e, now)
                else:
                    n += self._pump_entity(e, now)
        if self.dirty_sessions:
            ds, self.dirty_sessions = self.dirty_sessions, set()
            for s in ds:
                n += self._pump_session(s, now)
        return n

    def _assign_waiters(self, e: Entity, now: int) -> None:
        while e.session_waiters:
            s = self._pick_session(e)
            if s is None:
                return
            c = e.session_waiters.pop(0)
            c.waiting_deadline = None
            self._lock_session(c, s, now)

    def _pump_entity(self, e: Entity, now: int) -> int:
        avail = e.avail
        if not avail:
            return 0
        live = []
        for c in e.consumers:
            cr = c.sink.credit()
            if cr > 0:
                live.append([c, cr])
        n = 0
        msgs = e.msgs
        while live and avail:
            for slot in list(live):
                m = None
                while avail:
                    seq = heapq.heappop(avail)
                    cand = msgs.get(seq)
                    if cand is not None and cand.status == AVAILABLE:
                        if cand.expires_ms is not None and cand.expires_ms <= now:
                            self._expire(cand, now)
                            continue
                        m = cand
                        break
                if m is None:
                    break
                self._deliver(slot[0], m, now)
                n += 1
                slot[1] -= 1
                if slot[1] <= 0:
                    live.remove(slot)
        return n

    def _pump_session(self, s: Session, now: int) -> int:
        c = s.owner
        if c is None or c.closed or c.sink is None:
            return 0
        credit = c.sink.credit()
        n = 0
        msgs = s.entity.msgs
        while credit > 0 and s.heap:
            seq = heapq.heappop(s.heap)
            m = msgs.get(seq)
            if m is None or m.status != AVAILABLE:
                continue
            if m.expires_ms is not None and m.expires_ms <= now:
                self._expire(m, now)
                continue
            self._deliver(c, m, now)
            credit -= 1
            n += 1
        return n

    def _deliver(self, c: Consumer, m: Msg, now: int) -> None:
        token = self._new_token()
        self.stats["delivered"] += 1
        m.entity.ops["delivered"] += 1
        if c.rad:
            payload = m.encode(None)
            c.sink.deliver(payload, token, True)
            self._remove(m)
            return
        s = c.session
        if s is not None:
            locked_until = s.lock_until
            s.locked.add(m.uid)
        else:
            locked_until = now + m.entity.lock_ms
            heapq.heappush(self.lock_heap, (locked_until, next(self._heap_counter), token))
        m.status = LOCKED
        m.lock_token = token
        m.locked_until = locked_until
        m.consumer = c
        self.locks[token] = m
        c.sink.deliver(m.encode(locked_until), token, False)

    # ================================================================ settlement
    def _locked(self, token: bytes, consumer: Consumer | None = None) -> Msg:
        m = self.locks.get(token)
        if m is None or m.status != LOCKED:
            raise lock_lost()
        c = m.consumer
        if c is not None and c.session is not None:
            s = c.session
            if s.owner is not c or c.closed:
                raise session_lock_lost()
        return m

    def complete(self, token: bytes) -> None:
        m = self._locked(token)
        self._unlock_session(m)
        self._remove(m)
        self.stats["completed"] += 1
        m.entity.ops["completed"] += 1

    def _unlock_session(self, m: Msg) -> None:
        c = m.consumer
        if c is not None and c.session is not None:
            c.session.locked.discard(m.uid)
            self._maybe_drop_session(c.session)

    def abandon(self, token: bytes, now: int | None = None) -> None:
        m = self._locked(token)
        m.entity.ops["abandoned"] += 1
        self._unlock_session(m)
        self.locks.pop(token, None)
        self._failed_delivery(m, now or now_ms())

    def release(self, token: bytes, now: int | None = None) -> None:
        """Released: not a delivery attempt (the client never handed the message to the app)."""
        m = self.locks.get(token)
        if m is None or m.status != LOCKED:
            return
        m.entity.ops["released"] += 1
        self._unlock_session(m)
        self.locks.pop(token, None)
        if m.state == DEFERRED:
            self._to_deferred(m)
        else:
            self._make_available(m, now or now_ms())

    def _failed_delivery(self, m: Msg, now: int) -> None:
        m.dc += 1
        m.lock_token = None
        if m.dc >= m.entity.max_dc:
            self._dead_letter(m, MAX_DELIVERY_REASON,
                              f"Message could not be consumed after {m.entity.max_dc} delivery attempts.")
        elif m.state == DEFERRED:
            self._to_deferred(m)
        else:
            self._make_available(m, now)

    def _to_deferred(self, m: Msg) -> None:
        m.status = ST_DEFERRED
        m.state = DEFERRED
        m.lock_token = None
        m.consumer = None
        if self.store is not None:
            self.store.update(m)

    def dead_letter(self, token: bytes, reason: str | None, description: str | None) -> None:
        m = self._locked(token)
        m.entity.ops["deadlettered"] += 1
        self._unlock_session(m)
        self._dead_letter(m, reason, description)

    def defer(self, token: bytes) -> None:
        m = self._locked(token)
        m.entity.ops["deferred"] += 1
        self._unlock_session(m)
        self.locks.pop(token, None)
        self._to_deferred(m)

    def settle(self, token: bytes, outcome: str, reason: str | None = None, description: str | None = None) -> None:
        """outcome: completed | abandoned | defered | suspended (the management link's words)."""
        if outcome == "completed":
            self.complete(token)
        elif outcome == "abandoned":
            self.abandon(token)
        elif outcome == "defered":
            self.defer(token)
        elif outcome == "suspended":
            self.dead_letter(token, reason, description)
        else:
            raise BrokerError("com.microsoft:argument-error", f"unknown disposition status {outcome!r}", 400)

    def renew_lock(self, token: bytes, now: int | None = None) -> int:
        m = self._locked(token)
        now = now or now_ms()
        c = m.consumer
        if c is not None and c.session is not None:
            return c.session.lock_until
        m.locked_until = now + m.entity.lock_ms
        heapq.heappush(self.lock_heap, (m.locked_until, next(self._heap_counter), token))
        return m.locked_until

    # ================================================================ timers
    def next_deadline(self) -> int | None:
        cands = []
        if self.lock_heap:
            cands.append(self.lock_heap[0][0])
        if self.sched_heap:
            cands.append(self.sched_heap[0][0])
        if self.ttl_heap:
            cands.append(self.ttl_heap[0][0])
        if self.session_heap:
            cands.append(self.session_heap[0][0])
        return min(cands) if cands else None

    def tick(self, now: int | None = None) -> None:
        """Fire due timers: lock expiry, scheduled enqueue, time-to-live, session locks."""
        now = now or now_ms()
        lh = self.lock_heap
        while lh and lh[0][0] <= now:
            due, _, token = heapq.heappop(lh)
            m = self.locks.get(token)
            if m is not None and m.status == LOCKED and m.lock_token == token and m.locked_until <= now:
                self.locks.pop(token, None)
                m.entity.ops["lock_expired"] += 1
                self._failed_delivery(m, now)
        sh = self.sched_heap
        while sh and sh[0][0] <= now:
            _due, uid = heapq.heappop(sh)
            m = self.by_uid.get(uid)
            if m is not None and m.status == ST_SCHEDULED:
                m.state = ACTIVE
                m.enqueued_ms = m.scheduled_ms or now
                m.scheduled_ms = None
                self._set_expiry(m)
                self._make_available(m, now)
        th = self.ttl_heap
        while th and th[0][0] <= now:
            exp, uid = heapq.heappop(th)
            m = self.by_uid.get(uid)
            if m is not None and m.expires_ms == exp and m.status in (AVAILABLE, ST_DEFERRED):
                self._expire(m, now)
        ssh = self.session_heap
        while ssh and ssh[0][0] <= now:
            _due, _, obj = heapq.heappop(ssh)
            if isinstance(obj, Session):
                s = obj
                if s.owner is not None and s.lock_until <= now:
                    c = s.owner
                    self._release_session(s, now, increment=True)
                    c.session = None
                    c.closed = True
                    if c.sink is not None:
                        c.sink.session_lost()
            else:
                c = obj
                if c.waiting_deadline is not None and c.waiting_deadline <= now and not c.closed:
                    if c in c.entity.session_waiters:
                        c.entity.session_waiters.remove(c)
                    c.waiting_deadline = None
                    c.closed = True
                    if c.sink is not None:
                        c.sink.session_wait_timeout()
        if now - self._last_dup_prune > 5000:
            self._last_dup_prune = now
            self._prune(now)

    def _prune(self, now: int) -> None:
        for e in self.entities.values():
            if e.dups:
                cutoff = now - e.cfg.duplicate_window_ms
                d = e.dups
                pruned = False
                while d:
                    k, seen = next(iter(d.items()))
                    if seen > cutoff:
                        break
                    d.popitem(last=False)
                    pruned = True
                if pruned and self.store is not None:
                    self.store.prune_dups(e.name, cutoff)
        # lazily deleted heap entries: rebuild when mostly garbage
        if len(self.ttl_heap) > 2 * len(self.by_uid) + 10_000:
            self.ttl_heap = [(m.expires_ms, m.uid) for m in self.by_uid.values()
                             if m.expires_ms is not None and m.status in (AVAILABLE, ST_DEFERRED)]
            heapq.heapify(self.ttl_heap)
        if len(self.lock_heap) > 2 * len(self.locks) + 10_000:
            self.lock_heap = [(m.locked_until, next(self._heap_counter), t) for t, m in self.locks.items()]
            heapq.heapify(self.lock_heap)

    # ================================================================ management
    def peek(self, e: Entity, from_seq: int, count: int, session_id: str | None = None) -> list[Msg]:
        out = []
        for seq in sorted(s for s in e.msgs if s >= from_seq):
            m = e.msgs[seq]
            if session_id is not None and m.session_id != session_id:
                continue
            out.append(m)
            if len(out) >= count:
                break
        return out

    def receive_deferred(self, e: Entity, seqs: Iterable[int], receive_and_delete: bool,
                         session_id: str | None = None, now: int | None = None) -> list[tuple[Msg, bytes, bytes]]:
        """Returns (message, lock token, encoded message) for deferred messages."""
        now = now or now_ms()
        found = []
        for seq in seqs:
            m = e.msgs.get(int(seq))
            if m is None or m.status != ST_DEFERRED or (session_id is not None and m.session_id != session_id):
                raise BrokerError("com.microsoft:message-not-found",
                                  f"Failed to retrieve the deferred message with sequence number {seq}.", 404)
            found.append(m)
        out = []
        for m in found:
            token = self._new_token()
            if receive_and_delete:
                payload = m.encode(None)
                self._remove(m)
            else:
                m.status = LOCKED
                m.lock_token = token
                m.locked_until = now + e.lock_ms
                m.consumer = None
                self.locks[token] = m
                heapq.heappush(self.lock_heap, (m.locked_until, next(self._heap_counter), token))
                payload = m.encode(m.locked_until)
            out.append((m, token, payload))
        return out

    def schedule(self, e: Entity, raws: Iterable[bytes], now: int | None = None) -> list[int]:
        now = now or now_ms()
        seqs = self.send(e, raws, now)
        return [s if s is not None else -1 for s in seqs]

    def cancel_scheduled(self, e: Entity, seqs: Iterable[int]) -> None:
        for seq in seqs:
            m = e.msgs.get(int(seq))
            if m is not None and m.status == ST_SCHEDULED:
                self._remove(m)

    def _owned_session(self, e: Entity, sid: str, consumer: Consumer | None) -> Session:
        s = e.sessions.get(sid)
        if s is None or s.owner is None or s.owner.closed:
            raise session_lock_lost()
        if consumer is not None and s.owner is not consumer:
            raise session_lock_lost()
        return s

    def renew_session_lock(self, e: Entity, sid: str, consumer: Consumer | None = None,
                           now: int | None = None) -> int:
        s = self._owned_session(e, sid, consumer)
        now = now or now_ms()
        s.lock_until = now + e.lock_ms
        heapq.heappush(self.session_heap, (s.lock_until, next(self._heap_counter), s))
        return s.lock_until

    def get_session_state(self, e: Entity, sid: str, consumer: Consumer | None = None) -> bytes | None:
        self._owned_session(e, sid, consumer)
        return e.session_states.get(sid)

    def set_session_state(self, e: Entity, sid: str, state: bytes | None, consumer: Consumer | None = None) -> None:
        self._owned_session(e, sid, consumer)
        if state is None:
            e.session_states.pop(sid, None)
        else:
            e.session_states[sid] = bytes(state)
        if self.store is not None:
            self.store.set_session_state(e.name, sid, None if state is None else bytes(state))

    def list_sessions(self, e: Entity) -> list[str]:
        sids = {m.session_id for m in e.msgs.values() if m.session_id is not None}
        sids.update(e.session_states)
        return sorted(sids)

    def op_stats(self) -> dict[str, dict[str, Any]]:
        """Per-entity operation counters (see ``Entity.ops``), for --stats-file."""
        return {e.name: {k: (dict(v) if isinstance(v, dict) else v) for k, v in e.ops.items()}
                for e in self.entities.values()}

    def count_management(self, e: Entity, op: str) -> None:
        mg = e.ops["management"]
        mg[op] = mg.get(op, 0) + 1

    def counts(self, e: Entity) -> dict[str, int]:
        c = {"active": 0, "locked": 0, "deferred": 0, "scheduled": 0}
        for m in e.msgs.values():
            if m.status == AVAILABLE:
                c["active"] += 1
            elif m.status == LOCKED:
                c["locked"] += 1
            elif m.status == ST_DEFERRED:
                c["deferred"] += 1
            elif m.status == ST_SCHEDULED:
                c["scheduled"] += 1
        return c


def set_application_properties(raw: bytes, props: list[tuple[str, str]]) -> bytes:
    """Return ``raw`` with the given string application properties set (replacing same keys)."""
    if not props:
        return raw
    keys = {k for k, _ in props}
    new_entries = b"".join(codec.enc_string(k) + codec.enc_string(v) for k, v in props)
    body_start = len(raw)
    for code, sstart, vstart, vend in codec.iter_sections(raw):
        if code == codec.APPLICATION_PROPERTIES:
            kept = [entry for key, entry in codec.map_entries(raw, vstart) if key not in keys]
            inner = b"".join(kept) + new_entries
            section = b"\x00\x53\x74" + codec.enc_map_raw(inner, 2 * (len(kept) + len(props)))
            return raw[:sstart] + section + raw[vend:]
        if code > codec.APPLICATION_PROPERTIES:
            body_start = sstart
            break
    section = b"\x00\x53\x74" + codec.enc_map_raw(new_entries, 2 * len(props))
    return raw[:body_start] + section + raw[body_start:]
