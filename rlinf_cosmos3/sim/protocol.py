"""Wire format between the main environment and a simulator process.

The two sides run different numpy versions (>=2 in the main environment, <2 in LIBERO's), so
arrays never travel pickled: a message is a JSON header (scalars plus one descriptor per array:
name, dtype string, shape, offset) followed by the raw array bytes. Framing::

    [4 bytes header length, big endian][8 bytes payload length, big endian][header JSON][payload]

Only numpy and the standard library are used here, because the simulator side imports this file.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

_PREFIX = struct.Struct(">IQ")
PREFIX_SIZE = _PREFIX.size
MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_PAYLOAD_BYTES = 8 * 1024 * 1024 * 1024


def reset_fields(init_state_id: int, *, privileged: bool = False, init_state_task_id: int | None = None,
                 seed: int | None = None) -> dict[str, Any]:
    """The fields of a ``reset`` request, built in one place for every caller: the init state (of another task
    of the suite when ``init_state_task_id`` is given: an instruction swap) and the seed the scene's furniture is
    placed from (absent: from the process's own RNG, i.e. its history)."""
    fields: dict[str, Any] = {"init_state_id": int(init_state_id), "privileged": bool(privileged)}
    if init_state_task_id is not None:
        fields["init_state_task_id"] = int(init_state_task_id)
    if seed is not None:
        fields["seed"] = int(seed)
    return fields


class ProtocolError(RuntimeError):
    """A message on the simulator channel is malformed or truncated."""


@dataclass
class Message:
    """One request or reply: JSON-able ``fields`` plus named numpy ``arrays``."""

    fields: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


def _array_descriptor(name: str, arr: np.ndarray, offset: int) -> dict[str, Any]:
    if arr.dtype.hasobject or arr.dtype.fields is not None:
        raise ProtocolError(f"array {name!r}: dtype {arr.dtype} cannot be sent as raw bytes")
    return {"name": name, "dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset, "nbytes": arr.nbytes}


def _json_default(value: Any) -> Any:
    """numpy scalars (np.float64 rewards, np.bool_ flags) become plain Python values."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable; send arrays as arrays")


def encode(message: Message) -> bytes:
    """Serialise ``message`` to one framed byte string."""
    descriptors = []
    chunks = []
    offset = 0
    for name, value in message.arrays.items():
        arr = np.asarray(value)
        descriptors.append(_array_descriptor(name, arr, offset))
        chunks.append(arr.tobytes(order="C"))  # C-order bytes even for strided views and 0-d arrays
        offset += arr.nbytes
    header = json.dumps(
        {"fields": message.fields, "arrays": descriptors}, allow_nan=True, default=_json_default
    ).encode("utf-8")
    return _PREFIX.pack(len(header), offset) + header + b"".join(chunks)


def parse_prefix(prefix: bytes) -> tuple[int, int]:
    """Header and payload lengths from the fixed-size prefix, with sanity limits."""
    if len(prefix) != PREFIX_SIZE:
        raise ProtocolError(f"truncated prefix: {len(prefix)} of {PREFIX_SIZE} bytes")
    header_len, payload_len = _PREFIX.unpack(prefix)
    if header_len > MAX_HEADER_BYTES or payload_len > MAX_PAYLOAD_BYTES:
        raise ProtocolError(f"implausible message size (header {header_len}, payload {payload_len} bytes)")
    return header_len, payload_len


def decode_body(header_bytes: bytes, payload: bytes) -> Message:
    """Rebuild a message from its header JSON and payload (arrays are copies, writable)."""
    try:
        header = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"bad header: {exc}") from exc
    arrays: dict[str, np.ndarray] = {}
    for desc in header.get("arrays", []):
        start, nbytes = int(desc["offset"]), int(desc["nbytes"])
        if start + nbytes > len(payload):
            raise ProtocolError(f"array {desc['name']!r} runs past the payload end")
        dtype = np.dtype(desc["dtype"])
        flat = np.frombuffer(payload, dtype=dtype, count=nbytes // dtype.itemsize, offset=start)
        arrays[desc["name"]] = flat.reshape(desc["shape"]).copy()
    return Message(fields=header.get("fields", {}), arrays=arrays)


def decode(data: bytes) -> Message:
    """Inverse of :func:`encode` for a complete framed byte string."""
    header_len, payload_len = parse_prefix(data[:PREFIX_SIZE])
    expected = PREFIX_SIZE + header_len + payload_len
    if len(data) != expected:
        raise ProtocolError(f"message has {len(data)} bytes, framing says {expected}")
    body = data[PREFIX_SIZE:]
    return decode_body(body[:header_len], body[header_len:])


def _read_exact(stream: IO[bytes], n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            raise EOFError(f"stream closed after {len(buf)} of {n} bytes")
        buf.extend(chunk)
    return bytes(buf)


def read_message(stream: IO[bytes]) -> Message:
    """Blocking read of one message from a binary stream; EOFError on a clean close."""
    header_len, payload_len = parse_prefix(_read_exact(stream, PREFIX_SIZE))
    header = _read_exact(stream, header_len)
    payload = _read_exact(stream, payload_len)
    return decode_body(header, payload)


def write_message(stream: IO[bytes], message: Message) -> None:
    """Write one message and flush, so the peer sees it at once."""
    stream.write(encode(message))
    stream.flush()


def split_arrays(values: Mapping[str, Any]) -> Message:
    """Put numpy arrays of ``values`` into ``arrays`` and everything else into ``fields``."""
    msg = Message()
    for key, value in values.items():
        if isinstance(value, np.ndarray):
            msg.arrays[key] = value
        else:
            msg.fields[key] = value
    return msg
