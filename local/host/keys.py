"""Function keys, kept and checked as the Azure Functions host keeps and checks them.

**Kept.** One JSON file in the layout of the host's secrets file in Azure
(``azure-webjobs-secrets/{app}/host.json``): the master key, and the host keys (``functionKeys``,
named; ``default`` is the one made)::

    {"masterKey": {"name": "master", "value": "..."},
     "functionKeys": [{"name": "default", "value": "..."}]}

:func:`load_or_create` makes it once, with fresh random keys and readable by its owner only, and
reads it from then on: the keys hold from one run to the next until the file is deleted.

**Checked** (:func:`allows`), by the HTTP trigger's ``authLevel``:

* ``anonymous``: anyone;
* ``function``: a function key of that function, a host key or the master key. Here there are
  no per-function keys: a host key is accepted on every ``function`` route, as in Azure;
* ``admin`` (and the host's own ``/admin/...`` routes): the master key only.

The key is read from the ``x-functions-key`` header, else the ``code`` query parameter
(:func:`presented_key`). A request without a key that its route accepts gets 401 with an empty
body, as from the Azure host. docs/local-stack.md ("Where the local host stands against Azure")
cites the host's source for each of these.
"""

from __future__ import annotations

import base64
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

KEY_HEADER = "x-functions-key"
KEY_PARAM = "code"
ANONYMOUS, FUNCTION, ADMIN = "anonymous", "function", "admin"
LEVELS = (ANONYMOUS, FUNCTION, ADMIN)
KEYS_FILE = "host-keys.json"  # the local host's default: beside its settings file
MASTER_NAME = "master"
DEFAULT_NAME = "default"


class KeysError(ValueError):
    """The keys file cannot be read as keys."""


@dataclass(frozen=True)
class HostKeys:
    master: str
    host: Mapping[str, str]  # host keys by name ("default" first)

    @property
    def function(self) -> str:
        """The key a client of ``function`` routes is given: the host key ``default``."""
        return self.host.get(DEFAULT_NAME) or next(iter(self.host.values()))

    def allows(self, level: str, presented: str | None) -> bool:
        """Whether a request that presents ``presented`` may call a route of ``level``."""
        if level == ANONYMOUS:
            return True
        if not presented:
            return False
        if _same(presented, self.master):
            return True
        # (Each key is compared in full, whatever matched before: no early exit on a match.)
        return level == FUNCTION and any([_same(presented, k) for k in self.host.values()])


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


def level_of(value: object) -> str:
    """A trigger's ``authLevel`` (``FUNCTION``, ``Admin``, ...) as one of :data:`LEVELS`; none
    given is ``function``, the host's default. Anything else is a ``KeysError``."""
    level = str(value or FUNCTION).strip().lower()
    if level not in LEVELS:
        raise KeysError(f"unknown authLevel {value!r}: it must be one of {', '.join(LEVELS)}")
    return level


def presented_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The key a request presents: the ``x-functions-key`` header, else ``?code=``."""
    for name, value in headers.items():
        if name.lower() == KEY_HEADER and value:
            return value
    return query.get(KEY_PARAM) or None


def new_key() -> str:
    """A key as the host makes them: 40 random bytes, URL-safe base64 (54 characters)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(40)).decode("ascii").rstrip("=")


def load_or_create(path: Path) -> HostKeys:
    """The keys in ``path``; the file is made first if it does not exist (by one caller only,
    when several race: the file is created exclusively)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return load(path)
    doc = {"masterKey": {"name": MASTER_NAME, "value": new_key()},
           "functionKeys": [{"name": DEFAULT_NAME, "value": new_key()}]}
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    return load(path)


def load(path: Path) -> HostKeys:
    """The keys in ``path``; a ``KeysError`` naming the file if it does not hold them."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        master = str(doc["masterKey"]["value"])
        host = {str(k["name"]): str(k["value"]) for k in doc.get("functionKeys") or []}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise KeysError(f"{path}: not a keys file ({type(e).__name__}: {e})") from None
    if not master or not host or not all(host.values()):
        raise KeysError(f"{path}: needs a master key and at least one host key, none of them empty")
    return HostKeys(master, host)
