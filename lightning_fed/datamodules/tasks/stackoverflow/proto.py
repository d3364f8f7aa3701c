"""A minimal protobuf reader/writer for ``tf.train.Example`` (no TensorFlow needed): :func:`parse_example`,
:func:`encode_example` and the fast text extraction used by the build.
"""

from __future__ import annotations

import numbers
import struct
from typing import Any, Iterator, Optional


# ---------------------------------------------------------------------------------------------------------------
# A minimal protobuf reader/writer for tf.train.Example
# ---------------------------------------------------------------------------------------------------------------
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("malformed protobuf: varint longer than 10 bytes")


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(field_number, wire_type, value)``; value is an int (varint / fixed) or a bytes slice."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            n, pos = _varint(buf, pos)
            if pos + n > end:
                raise ValueError("malformed protobuf: length-delimited field runs past the end")
            value = buf[pos:pos + n]
            pos += n
        elif wire == 5:
            value = buf[pos:pos + 4]
            pos += 4
        elif wire == 1:
            value = buf[pos:pos + 8]
            pos += 8
        else:
            raise ValueError(f"malformed protobuf: unsupported wire type {wire}")
        yield field, wire, value


def _parse_feature(buf: bytes) -> list:
    for field, wire, value in _fields(buf):
        if field == 1 and wire == 2:  # BytesList
            return [v for f, w, v in _fields(value) if f == 1]
        if field == 2 and wire == 2:  # FloatList (packed or not)
            out: list = []
            for f, w, v in _fields(value):
                if f == 1 and w == 2:
                    out.extend(struct.unpack(f"<{len(v) // 4}f", v))
                elif f == 1 and w == 5:
                    out.append(struct.unpack("<f", v)[0])
            return out
        if field == 3 and wire == 2:  # Int64List (packed or not)
            out = []
            for f, w, v in _fields(value):
                if f == 1 and w == 2:
                    p = 0
                    while p < len(v):
                        x, p = _varint(v, p)
                        out.append(x - (1 << 64) if x >= 1 << 63 else x)
                elif f == 1 and w == 0:
                    out.append(v - (1 << 64) if v >= 1 << 63 else v)
            return out
    return []


def parse_example(blob: bytes) -> dict[str, list]:
    """Decode a serialized ``tf.train.Example`` into ``{name: values}`` (bytes / float / int lists).

    Raises:
        ValueError: malformed protobuf.
    """
    blob = bytes(blob)
    out: dict[str, list] = {}
    for field, wire, features in _fields(blob):
        if field != 1 or wire != 2:
            continue
        for f, w, entry in _fields(features):
            if f != 1 or w != 2:
                continue
            key, value = "", b""
            for ef, ew, ev in _fields(entry):
                if ef == 1 and ew == 2:
                    key = bytes(ev).decode("utf-8")
                elif ef == 2 and ew == 2:
                    value = ev
            out[key] = _parse_feature(value)
    return out


def _enc_varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _ld(field: int, payload: bytes) -> bytes:
    return _enc_varint(field << 3 | 2) + _enc_varint(len(payload)) + payload


def encode_example(features: dict[str, Any]) -> bytes:
    """Serialize ``{name: value}`` as a ``tf.train.Example`` (the inverse of :func:`parse_example`).

    A ``str``/``bytes`` value becomes a one-element BytesList, an ``int`` an Int64List, a ``float`` a FloatList;
    lists of them are kept as lists. Used by tests to write files in TFF's format.
    """
    entries = b""
    for key, value in features.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        if all(isinstance(v, (str, bytes)) for v in values):
            inner = b"".join(_ld(1, v.encode("utf-8") if isinstance(v, str) else v) for v in values)
            feature = _ld(1, inner)
        elif all(isinstance(v, numbers.Integral) for v in values):
            feature = _ld(3, _ld(1, b"".join(_enc_varint(int(v)) for v in values)))
        else:
            feature = _ld(2, _ld(1, struct.pack(f"<{len(values)}f", *map(float, values))))
        entries += _ld(1, _ld(1, key.encode("utf-8")) + _ld(2, feature))
    return _ld(1, entries)


def _text(features: dict[str, list], name: str) -> str:
    values = features.get(name) or [b""]
    v = values[0]
    return v.decode("utf-8", errors="replace") if isinstance(v, (bytes, bytearray)) else str(v)


_WANTED = {b"tokens": 0, b"title": 1, b"tags": 2}


def _len_at(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    return (b, pos + 1) if b < 0x80 else _varint(buf, pos)


def _fast_texts(blob: bytes) -> Optional[list[bytes]]:
    """``[tokens, title, tags]`` (raw bytes) from the usual layout of a ``tf.train.Example`` written by TensorFlow
    (each map entry = key then a BytesList feature), several times faster than :func:`parse_example`; ``None``
    whenever anything differs from that layout (the caller then uses :func:`parse_example`)."""
    try:
        if blob[0] != 0x0A:
            return None
        n, pos = _len_at(blob, 1)  # Example.features: the map entries follow
        end = pos + n
        if end != len(blob):
            return None
        out: list = [b"", b"", b""]
        while pos < end:
            if blob[pos] != 0x0A:  # map entry
                return None
            n, pos = _len_at(blob, pos + 1)
            entry_end = pos + n
            if blob[pos] != 0x0A:
                return None
            n, p = _len_at(blob, pos + 1)
            slot = _WANTED.get(blob[p:p + n])
            if slot is not None:
                p += n
                if blob[p] != 0x12:  # the value
                    return None
                n, p = _len_at(blob, p + 1)
                if p + n != entry_end or blob[p] != 0x0A:  # Feature = BytesList only
                    return None
                n, p = _len_at(blob, p + 1)
                if p + n != entry_end:
                    return None
                if n:
                    if blob[p] != 0x0A:
                        return None
                    n, p = _len_at(blob, p + 1)
                    if p + n > entry_end:
                        return None
                    out[slot] = blob[p:p + n]
                else:
                    out[slot] = b""
            pos = entry_end
        if pos != end:
            return None
        return out
    except IndexError:
        return None


def _example_texts(blob: bytes) -> tuple[str, str, str]:
    """``(tokens, title, tags)`` of a serialized example, as :func:`parse_example` + the first value of each."""
    blob = bytes(blob)
    raw = _fast_texts(blob)
    if raw is None:
        f = parse_example(blob)
        return _text(f, "tokens"), _text(f, "title"), _text(f, "tags")
    return tuple(v.decode("utf-8", errors="replace") for v in raw)  # type: ignore[return-value]
