"""A small AMQP 1.0 codec for the broker's hot path.

Messages are kept as the bytes the sender encoded. The broker only needs to find the
section boundaries, read a handful of fields (header ttl, message-id, group-id, the
scheduled-enqueue-time annotation) and, on delivery, put its own header and message
annotations in front of the untouched rest (properties, application-properties, body,
footer). Doing that at byte level avoids a full decode/encode per message.

Management and $cbs traffic is rare and uses proton's own Message codec instead.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")

# Section descriptor codes
HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78


class CodecError(ValueError):
    pass


class Symbol(str):
    """An AMQP symbol (decoded), kept apart from strings so it can be re-encoded as one."""

    __slots__ = ()


class Timestamp(int):
    """An AMQP timestamp in ms since the Unix epoch."""

    __slots__ = ()


def skip(buf: bytes | memoryview, pos: int) -> int:
    """Return the position just after the AMQP value starting at ``pos``."""
    c = buf[pos]
    pos += 1
    if c == 0:
        pos = skip(buf, pos)  # descriptor
        return skip(buf, pos)
    hi = c & 0xF0
    if hi == 0x40:
        return pos
    if hi == 0x50:
        return pos + 1
    if hi == 0x60:
        return pos + 2
    if hi == 0x70:
        return pos + 4
    if hi == 0x80:
        return pos + 8
    if hi == 0x90:
        return pos + 16
    if hi in (0xA0, 0xC0, 0xE0):
        return pos + 1 + buf[pos]
    if hi in (0xB0, 0xD0, 0xF0):
        return pos + 4 + _U32.unpack_from(buf, pos)[0]
    raise CodecError(f"bad constructor 0x{c:02x}")


def decode(buf: bytes | memoryview, pos: int = 0) -> tuple[Any, int]:
    """Decode one AMQP value into Python; returns (value, next position)."""
    return _dec(buf[pos], buf, pos + 1)


def _dec(c: int, buf: bytes | memoryview, pos: int) -> tuple[Any, int]:
    """Decode the value after constructor ``c`` whose payload starts at ``pos``."""
    if c == 0x40:
        return None, pos
    if c == 0x41:
        return True, pos
    if c == 0x42:
        return False, pos
    if c == 0x56:
        return buf[pos] != 0, pos + 1
    if c in (0x43, 0x44):
        return 0, pos
    if c in (0x50, 0x52, 0x53):
        return buf[pos], pos + 1
    if c == 0x51 or c == 0x54 or c == 0x55:
        v = buf[pos]
        return (v - 256 if v > 127 else v), pos + 1
    if c == 0x60:
        return _U16.unpack_from(buf, pos)[0], pos + 2
    if c == 0x61:
        return _I16.unpack_from(buf, pos)[0], pos + 2
    if c == 0x70:
        return _U32.unpack_from(buf, pos)[0], pos + 4
    if c == 0x71:
        return _I32.unpack_from(buf, pos)[0], pos + 4
    if c == 0x72:
        return _F32.unpack_from(buf, pos)[0], pos + 4
    if c == 0x73:
        return chr(_U32.unpack_from(buf, pos)[0]), pos + 4
    if c == 0x80:
        return _U64.unpack_from(buf, pos)[0], pos + 8
    if c == 0x81:
        return _I64.unpack_from(buf, pos)[0], pos + 8
    if c == 0x82:
        return _F64.unpack_from(buf, pos)[0], pos + 8
    if c == 0x83:
        return Timestamp(_I64.unpack_from(buf, pos)[0]), pos + 8
    if c == 0x98:
        return uuid.UUID(bytes=bytes(buf[pos:pos + 16])), pos + 16
    if c == 0xA0:
        n = buf[pos]
        return bytes(buf[pos + 1:pos + 1 + n]), pos + 1 + n
    if c == 0xB0:
        n = _U32.unpack_from(buf, pos)[0]
        return bytes(buf[pos + 4:pos + 4 + n]), pos + 4 + n
    if c == 0xA1:
        n = buf[pos]
        return bytes(buf[pos + 1:pos + 1 + n]).decode("utf-8"), pos + 1 + n
    if c == 0xB1:
        n = _U32.unpack_from(buf, pos)[0]
        return bytes(buf[pos + 4:pos + 4 + n]).decode("utf-8"), pos + 4 + n
    if c == 0xA3:
        n = buf[pos]
        return Symbol(bytes(buf[pos + 1:pos + 1 + n]).decode("ascii")), pos + 1 + n
    if c == 0xB3:
        n = _U32.unpack_from(buf, pos)[0]
        return Symbol(bytes(buf[pos + 4:pos + 4 + n]).decode("ascii")), pos + 4 + n
    if c == 0x45:
        return [], pos
    if c in (0xC0, 0xD0, 0xC1, 0xD1, 0xE0, 0xF0):
        if c & 0xF0 in (0xC0, 0xE0):
            count = buf[pos + 1]
            p = pos + 2
            end = pos + 1 + buf[pos]
        else:
            count = _U32.unpack_from(buf, pos + 4)[0]
            p = pos + 8
            end = pos + 4 + _U32.unpack_from(buf, pos)[0]
        items = []
        if c in (0xE0, 0xF0):
            elem = buf[p]
            if elem == 0:
                raise CodecError("described arrays are not supported")
            p += 1
            for _ in range(count):
                v, p = _dec(elem, buf, p)
                items.append(v)
            return items, end
        for _ in range(count):
            v, p = _dec(buf[p], buf, p + 1)
            items.append(v)
        if c & 0x0F == 0x01:
            return {items[i]: items[i + 1] for i in range(0, len(items), 2)}, end
        return items, end
    if c == 0x00:
        descriptor, pos = decode(buf, pos)
        value, pos = decode(buf, pos)
        return Described(descriptor, value), pos
    raise CodecError(f"cannot decode constructor 0x{c:02x}")


class Described:
    __slots__ = ("descriptor", "value")

    def __init__(self, descriptor: Any, value: Any) -> None:
        self.descriptor = descriptor
        self.value = value

    def __repr__(self) -> str:
        return f"Described({self.descriptor!r}, {self.value!r})"


# ---------------------------------------------------------------- encoding


def enc_symbol(s: str) -> bytes:
    b = s.encode("ascii")
    if len(b) < 256:
        return b"\xa3" + bytes([len(b)]) + b
    return b"\xb3" + _U32.pack(len(b)) + b


def enc_string(s: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) < 256:
        return b"\xa1" + bytes([len(b)]) + b
    return b"\xb1" + _U32.pack(len(b)) + b


def enc_long(v: int) -> bytes:
    return b"\x81" + _I64.pack(v)


def enc_timestamp(ms: int) -> bytes:
    return b"\x83" + _I64.pack(ms)


def enc_uint(v: int) -> bytes:
    return b"\x70" + _U32.pack(v)


def enc_int(v: int) -> bytes:
    return b"\x71" + _I32.pack(v)


def enc_value(v: Any) -> bytes:
    """Encode a simple Python value (used for annotations and application properties)."""
    if v is None:
        return b"\x40"
    if v is True:
        return b"\x41"
    if v is False:
        return b"\x42"
    if isinstance(v, Symbol):
        return enc_symbol(v)
    if isinstance(v, str):
        return enc_string(v)
    if isinstance(v, Timestamp):
        return enc_timestamp(v)
    if isinstance(v, int):
        return enc_long(v)
    if isinstance(v, float):
        return b"\x82" + _F64.pack(v)
    if isinstance(v, (bytes, bytearray)):
        n = len(v)
        return (b"\xa0" + bytes([n]) if n < 256 else b"\xb0" + _U32.pack(n)) + bytes(v)
    if isinstance(v, uuid.UUID):
        return b"\x98" + v.bytes
    raise CodecError(f"cannot encode {type(v).__name__}")


def enc_map_raw(inner: bytes, count: int) -> bytes:
    """A map from already encoded entries (``count`` = number of keys + values)."""
    return b"\xd1" + _U32.pack(len(inner) + 4) + _U32.pack(count) + inner


def enc_list_raw(inner: bytes, count: int) -> bytes:
    if count == 0:
        return b"\x45"
    if len(inner) + 1 < 256 and count < 256:
        return b"\xc0" + bytes([len(inner) + 1, count]) + inner
    return b"\xd0" + _U32.pack(len(inner) + 4) + _U32.pack(count) + inner


def compound_inner(buf: bytes | memoryview, pos: int) -> tuple[int, int, int]:
    """For a list/map at ``pos``: (element count, first element position, end position)."""
    c = buf[pos]
    if c == 0x45:
        return 0, pos + 1, pos + 1
    if c in (0xC0, 0xC1):
        return buf[pos + 2], pos + 3, pos + 2 + buf[pos + 1]
    if c in (0xD0, 0xD1):
        size = _U32.unpack_from(buf, pos + 1)[0]
        return _U32.unpack_from(buf, pos + 5)[0], pos + 9, pos + 5 + size
    if c == 0x40:
        return 0, pos + 1, pos + 1
    raise CodecError(f"not a list/map: 0x{c:02x}")


def map_entries(buf: bytes | memoryview, pos: int) -> list[tuple[Any, bytes]]:
    """Split an encoded map into (decoded key, encoded key+value bytes) pairs."""
    count, p, _end = compound_inner(buf, pos)
    out = []
    for _ in range(count // 2):
        start = p
        key, p = decode(buf, p)
        p = skip(buf, p)
        out.append((key, bytes(buf[start:p])))
    return out


def section_header(code: int) -> bytes:
    return b"\x00\x53" + bytes([code])


def encode_header(durable: Any, priority: Any, ttl: Any, first_acquirer: Any, delivery_count: int) -> bytes:
    fields = [
        b"\x40" if durable is None else (b"\x41" if durable else b"\x42"),
        b"\x40" if priority is None else b"\x50" + bytes([priority & 0xFF]),
        b"\x40" if ttl is None else enc_uint(ttl),
        b"\x40" if first_acquirer is None else (b"\x41" if first_acquirer else b"\x42"),
        enc_uint(delivery_count),
    ]
    inner = b"".join(fields)
    return b"\x00\x53\x70" + enc_list_raw(inner, 5)


def iter_sections(buf: bytes | memoryview, start: int = 0, end: int | None = None):
    """Yield (code, section start, value start, section end) for each message section."""
    pos = start
    n = len(buf) if end is None else end
    while pos < n:
        if buf[pos] != 0:
            raise CodecError("message section is not a described type")
        d = buf[pos + 1]
        if d == 0x53:
            code = buf[pos + 2]
            vstart = pos + 3
        elif d == 0x80:
            code = _U64.unpack_from(buf, pos + 2)[0]
            vstart = pos + 10
        elif d == 0xA3:  # symbolic descriptor
            ln = buf[pos + 2]
            name = bytes(buf[pos + 3:pos + 3 + ln])
            code = _SYMBOLIC_SECTIONS.get(name, -1)
            vstart = pos + 3 + ln
        else:
            raise CodecError("bad section descriptor")
        vend = skip(buf, vstart)
        if vend > n:
            raise CodecError("truncated section")
        yield code, pos, vstart, vend
        pos = vend


_SYMBOLIC_SECTIONS = {
    b"amqp:header:list": HEADER,
    b"amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    b"amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    b"amqp:properties:list": PROPERTIES,
    b"amqp:application-properties:map": APPLICATION_PROPERTIES,
    b"amqp:data:binary": DATA,
    b"amqp:amqp-sequence:list": AMQP_SEQUENCE,
    b"amqp:amqp-value:*": AMQP_VALUE,
    b"amqp:footer:map": FOOTER,
}


def looks_like_message(buf: bytes) -> bool:
    """True if ``buf`` parses completely as a sequence of AMQP message sections."""
    if len(buf) < 3 or buf[0] != 0 or buf[1] != 0x53 or not (0x70 <= buf[2] <= 0x78):
        return False
    try:
        last = -1
        for code, _s, _v, _e in iter_sections(buf):
            if not (0x70 <= code <= 0x78) or code < last:
                return False
            last = code
        return True
    except (CodecError, IndexError, struct.error):
        return False


def split_batch(buf: bytes) -> list[bytes] | None:
    """If ``buf`` is a batch envelope (format 0x80013700), return the inner encoded messages.

    The envelope's body is a sequence of data sections, each one whole encoded message.
    Proton does not expose the transfer's message-format, so the structure decides.
    """
    datas = []
    try:
        for code, _s, vstart, vend in iter_sections(buf):
            if code == DATA:
                c = buf[vstart]
                if c == 0xA0:
                    datas.append(buf[vstart + 2:vend])
                elif c == 0xB0:
                    datas.append(buf[vstart + 5:vend])
                else:
                    return None
            elif code in (AMQP_VALUE, AMQP_SEQUENCE, APPLICATION_PROPERTIES, HEADER):
                return None
    except (CodecError, IndexError, struct.error):
        return None
    if not datas:
        return None
    for d in datas:
        if not looks_like_message(d):
            return None
    return datas
