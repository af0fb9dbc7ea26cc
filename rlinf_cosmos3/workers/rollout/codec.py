"""Wire format of the SGLang action endpoint: msgpack with numpy arrays, or plain JSON.

SGLang packs an array as ``{"__ndarray__": True, "data": bytes, "dtype": str, "shape": [...]}``.
Its responses use *bytes* keys (``b"__ndarray__"``, ``b"data"``, ...), requests may use either, so
the decoder accepts both. JSON has no arrays: images become nested pixel lists, which the server
reads back as a list of images — a ``[B, H, W, C]`` array turns into exactly that list.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack
import numpy as np

MSGPACK_CONTENT_TYPE = "application/msgpack"
JSON_CONTENT_TYPE = "application/json"
_ARRAY_KEYS = ("__ndarray__", "data", "dtype", "shape")


def _pack_default(obj: Any) -> Any:
    """msgpack ``default`` hook: numpy arrays and scalars into SGLang's array map."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "VOc":
            raise TypeError(f"cannot send a numpy array of dtype {obj.dtype} to SGLang")
        return {"__ndarray__": True, "data": np.ascontiguousarray(obj).tobytes(), "dtype": obj.dtype.str,
                "shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot msgpack-encode {type(obj).__name__}")


def _get(obj: dict, key: str) -> Any:
    return obj[key] if key in obj else obj.get(key.encode())


def _unpack_hook(obj: dict) -> Any:
    """msgpack ``object_hook``: SGLang's array map (str or bytes keys) back into a numpy array."""
    if not _get(obj, "__ndarray__"):
        return obj
    missing = [k for k in _ARRAY_KEYS[1:] if _get(obj, k) is None]
    if missing:
        raise ValueError(f"msgpack array map lacks {missing}")
    dtype = _get(obj, "dtype")
    dtype = dtype.decode() if isinstance(dtype, bytes) else dtype
    # np.frombuffer gives a read-only view of the message; copy so callers may write.
    flat = np.frombuffer(_get(obj, "data"), dtype=np.dtype(dtype))
    return flat.reshape(tuple(_get(obj, "shape"))).copy()


def encode_msgpack(payload: Any) -> bytes:
    return msgpack.packb(payload, default=_pack_default, use_bin_type=True)


def decode_msgpack(body: bytes) -> Any:
    return msgpack.unpackb(body, object_hook=_unpack_hook, raw=False, strict_map_key=False)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic):
        return obj.tolist()
    raise TypeError(f"cannot JSON-encode {type(obj).__name__}")


def encode_json(payload: Any) -> bytes:
    return json.dumps(payload, default=_jsonable).encode()


def decode_json(body: bytes) -> Any:
    return json.loads(body)


def encode(payload: Any, encoding: str) -> tuple[bytes, dict[str, str]]:
    """Body and headers for a request in ``encoding`` (``msgpack`` or ``json``)."""
    if encoding == "msgpack":
        return encode_msgpack(payload), {"Content-Type": MSGPACK_CONTENT_TYPE, "Accept": MSGPACK_CONTENT_TYPE}
    if encoding == "json":
        return encode_json(payload), {"Content-Type": JSON_CONTENT_TYPE, "Accept": JSON_CONTENT_TYPE}
    raise ValueError(f"unknown encoding {encoding!r}; use 'msgpack' or 'json'")


def decode(body: bytes, content_type: str) -> Any:
    """Response body by its content type (SGLang answers msgpack only when asked)."""
    if MSGPACK_CONTENT_TYPE in content_type.lower():
        return decode_msgpack(body)
    return decode_json(body)
