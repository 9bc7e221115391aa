"""Durable storage: SQLite in WAL mode as a write-behind log of the in-memory broker.

Fsync policy
------------
* The broker changes its in-memory state while it handles a reactor tick and records the
  changed messages here. ``commit()`` runs once at the end of every tick, in ONE SQLite
  transaction, BEFORE anything of that tick goes out on the wire: no send is acknowledged
  (``accepted``), no settlement confirmed and no management reply sent before the change it
  reports is committed.
* ``journal_mode=WAL`` with ``synchronous=NORMAL``: a commit is a write() into the WAL file
  without fsync; the WAL is fsynced at checkpoints. So a crash of the emulator process
  (SIGKILL included) loses nothing that was acknowledged; a crash of the operating system
  or a power loss may lose the last commits before the most recent checkpoint.
* ``locking_mode=EXCLUSIVE``: one emulator process owns the data folder.
* Locks are not stored. After a restart every message that was locked is available again,
  with its delivery count as last committed.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id           INTEGER PRIMARY KEY,
    entity       TEXT    NOT NULL,
    seq          INTEGER NOT NULL,
    state        INTEGER NOT NULL,
    dc           INTEGER NOT NULL,
    enqueued_ms  INTEGER NOT NULL,
    expires_ms   INTEGER,
    scheduled_ms INTEGER,
    raw          BLOB    NOT NULL
);
CREATE TABLE IF NOT EXISTS dups (
    entity     TEXT    NOT NULL,
    message_id TEXT    NOT NULL,
    seen_ms    INTEGER NOT NULL,
    PRIMARY KEY (entity, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS dups_by_time ON dups(entity, seen_ms);
CREATE TABLE IF NOT EXISTS session_state (
    entity     TEXT NOT NULL,
    session_id TEXT NOT NULL,
    state      BLOB,
    PRIMARY KEY (entity, session_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""


class Store:
    """Write-behind persistence. Call insert/update/delete freely; ``commit()`` once per tick."""

    def __init__(self, data_dir: str | Path) -> None:
        path = Path(data_dir)
        path.mkdir(parents=True, exist_ok=True)
        self.path = path / "servicebus.sqlite3"
        self.db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        # One process owns the store: exclusive locking saves the per-transaction lock syscalls
        # (and keeps a second emulator from opening the same data folder).
        self.db.execute("PRAGMA locking_mode=EXCLUSIVE")
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA temp_store=MEMORY")
        self.db.execute("PRAGMA cache_size=-32000")
        self.db.executescript(SCHEMA)
        self._new: dict[int, Any] = {}
        self._meta_upd: dict[int, Any] = {}
        self._full_upd: dict[int, Any] = {}
        self._del: set[int] = set()
        self._dups: list[tuple[str, str, int]] = []
        self._states: dict[tuple[str, str], bytes | None] = {}
        self._meta: dict[str, int] = {}
        self._dup_prune: list[tuple[str, int]] = []
        self.commits = 0

    # ------------------------------------------------------------ load
    def load_meta(self) -> dict[str, int]:
        return {k: v for k, v in self.db.execute("SELECT key, value FROM meta")}

    def load_messages(self) -> Iterator[tuple[int, str, int, int, int, int, int | None, int | None, bytes]]:
        yield from self.db.execute(
            "SELECT id, entity, seq, state, dc, enqueued_ms, expires_ms, scheduled_ms, raw FROM messages ORDER BY id")

    def load_dups(self, now_ms: int) -> Iterator[tuple[str, str, int]]:
        yield from self.db.execute("SELECT entity, message_id, seen_ms FROM dups ORDER BY seen_ms")

    def load_session_states(self) -> Iterator[tuple[str, str, bytes | None]]:
        yield from self.db.execute("SELECT entity, session_id, state FROM session_state")

    # ------------------------------------------------------------ recording
    def insert(self, msg: Any) -> None:
        self._new[msg.uid] = msg

    def update(self, msg: Any, full: bool = False) -> None:
        uid = msg.uid
        if uid in self._new:
            return  # the pending insert reads the latest values
        if full:
            self._full_upd[uid] = msg
            self._meta_upd.pop(uid, None)
        elif uid not in self._full_upd:
            self._meta_upd[uid] = msg

    def delete(self, msg: Any) -> None:
        uid = msg.uid
        if self._new.pop(uid, None) is not None:
            return  # never written: nothing to delete
        self._meta_upd.pop(uid, None)
        self._full_upd.pop(uid, None)
        self._del.add(uid)

    def add_dup(self, entity: str, message_id: str, seen_ms: int) -> None:
        self._dups.append((entity, message_id, seen_ms))

    def prune_dups(self, entity: str, before_ms: int) -> None:
        self._dup_prune.append((entity, before_ms))

    def set_session_state(self, entity: str, session_id: str, state: bytes | None) -> None:
        self._states[(entity, session_id)] = state

    def set_meta(self, key: str, value: int) -> None:
        self._meta[key] = value

    @property
    def dirty(self) -> bool:
        return bool(self._new or self._meta_upd or self._full_upd or self._del or self._dups
                    or self._states or self._meta or self._dup_prune)

    def commit(self) -> None:
        if not self.dirty:
            return
        db = self.db
        db.execute("BEGIN")
        try:
            if self._del:
                db.executemany("DELETE FROM messages WHERE id=?", [(u,) for u in self._del])
            if self._new:
                db.executemany(
                    "INSERT OR REPLACE INTO messages(id, entity, seq, state, dc, enqueued_ms, expires_ms, "
                    "scheduled_ms, raw) VALUES (?,?,?,?,?,?,?,?,?)",
                    [(m.uid, m.entity.name, m.seq, m.state, m.dc, m.enqueued_ms, m.expires_ms, m.scheduled_ms,
                      m.raw) for m in self._new.values()])
            if self._full_upd:
                db.executemany(
                    "UPDATE messages SET entity=?, seq=?, state=?, dc=?, enqueued_ms=?, expires_ms=?, "
                    "scheduled_ms=?, raw=? WHERE id=?",
                    [(m.entity.name, m.seq, m.state, m.dc, m.enqueued_ms, m.expires_ms, m.scheduled_ms, m.raw,
                      m.uid) for m in self._full_upd.values()])
            if self._meta_upd:
                db.executemany(
                    "UPDATE messages SET state=?, dc=?, enqueued_ms=?, expires_ms=?, scheduled_ms=? WHERE id=?",
                    [(m.state, m.dc, m.enqueued_ms, m.expires_ms, m.scheduled_ms, m.uid)
                     for m in self._meta_upd.values()])
            if self._dups:
                db.executemany("INSERT OR REPLACE INTO dups(entity, message_id, seen_ms) VALUES (?,?,?)",
                               self._dups)
            if self._dup_prune:
                db.executemany("DELETE FROM dups WHERE entity=? AND seen_ms<?", self._dup_prune)
            if self._states:
                for (entity, sid), state in self._states.items():
                    if state is None:
                        db.execute("DELETE FROM session_state WHERE entity=? AND session_id=?", (entity, sid))
                    else:
                        db.execute("INSERT OR REPLACE INTO session_state(entity, session_id, state) VALUES (?,?,?)",
                                   (entity, sid, state))
            if self._meta:
                db.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?,?)", list(self._meta.items()))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._new.clear()
        self._meta_upd.clear()
        self._full_upd.clear()
        self._del.clear()
        self._dups.clear()
        self._dup_prune.clear()
        self._states.clear()
        self._meta.clear()
        self.commits += 1

    def close(self) -> None:
        try:
            self.commit()
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self.db.close()


def now_ms() -> int:
    return int(time.time() * 1000)


__all__ = ["Store", "now_ms"]
