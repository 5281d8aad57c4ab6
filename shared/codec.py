"""msgpack codec for jetrl messages: strict decoding, packed arrays, schema versions.

Wire form of every message: a msgpack map with `schema` (message name), `v` (major schema version,
an int) and the message's fields. Token ids, masks, logprobs and versions travel as packed
little-endian bytes (int32 / uint8 / float32), which keeps a 2k-token sample near 24 KB and costs
microseconds to encode (see ../shared/notes/measured.md: a list of ints is ~45x slower).

Versioning: additive changes (a new optional field) keep `v`; a receiver keeps fields it does not
know in `extra` and writes them back on re-encode, so a relay never loses them. A change that breaks
old readers bumps `v`; a reader refuses a message whose `v` is newer than the one it knows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import numpy as np

# Packed array kinds: wire dtype (little-endian) per field type code.
ARRAY_DTYPES = {"i32": np.dtype("<i4"), "f32": np.dtype("<f4"), "u8": np.dtype("u1")}


class DecodeError(ValueError):
    """A message could not be decoded. `where` names the message and the field, `reason` what is wrong."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


class MessageTooLarge(ValueError):
    """An encoded message is bigger than the server's max_payload."""

    def __init__(self, schema: str, size: int, limit: int, subject: str = ""):
        where = f" on {subject}" if subject else ""
        super().__init__(
            f"{schema} message{where} is {size} bytes, over the NATS server's max_payload of {limit} bytes: "
            f"raise max_payload on the server (jetrl's embedded server and compose file use 8 MiB) "
            f"or send fewer/shorter samples per group"
        )
        self.size = size
        self.limit = limit


def pack_array(values: Any, kind: str) -> bytes:
    """Pack a sequence or numpy array as little-endian bytes of the wire dtype of `kind`."""
    return np.ascontiguousarray(values, dtype=ARRAY_DTYPES[kind]).tobytes()


def unpack_array(raw: bytes, kind: str, where: str) -> np.ndarray:
    dtype = ARRAY_DTYPES[kind]
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise DecodeError(where, f"expected packed {kind} bytes, got {type(raw).__name__}")
    if len(raw) % dtype.itemsize:
        raise DecodeError(where, f"{len(raw)} bytes is not a whole number of {kind} items ({dtype.itemsize} bytes each)")
    return np.frombuffer(raw, dtype=dtype)


_SCALAR_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (float, int),
    "bool": (bool,),
    "bytes": (bytes, bytearray),
    "map": (dict,),
    "list": (list, tuple),
}


def _check_scalar(value: Any, code: str, where: str) -> Any:
    if code == "any":
        return value
    types = _SCALAR_TYPES[code]
    # bool is an int subclass in Python, but never a valid int/float on our wire.
    if isinstance(value, bool) and code in ("int", "float"):
        raise DecodeError(where, f"expected {code}, got bool")
    if not isinstance(value, types):
        raise DecodeError(where, f"expected {code}, got {type(value).__name__}")
    if code == "float":
        return float(value)
    if code == "list":
        return list(value)
    if code == "bytes":
        return bytes(value)
    return value


def decode_value(value: Any, code: str, where: str) -> Any:
    optional = code.endswith("?")
    if optional:
        if value is None:
            return None
        code = code[:-1]
    if code in ARRAY_DTYPES:
        return unpack_array(value, code, where)
    if code.startswith("list[") and code.endswith("]"):
        inner = code[5:-1]
        items = _check_scalar(value, "list", where)
        return [decode_value(item, inner, f"{where}[{i}]") for i, item in enumerate(items)]
    if code in _SCALAR_TYPES or code == "any":
        return _check_scalar(value, code, where)
    nested = NESTED.get(code)
    if nested is None:  # pragma: no cover - a bug in a schema definition, not bad input
        raise TypeError(f"unknown field type code {code!r}")
    if not isinstance(value, dict):
        raise DecodeError(where, f"expected a {code} map, got {type(value).__name__}")
    return decode_fields(nested, value, where)


def encode_value(value: Any, code: str) -> Any:
    if code.endswith("?"):
        if value is None:
            return None
        code = code[:-1]
    if code in ARRAY_DTYPES:
        return pack_array(value, code)
    if code.startswith("list[") and code.endswith("]"):
        inner = code[5:-1]
        return [encode_value(item, inner) for item in value]
    if code in NESTED:
        return encode_fields(value)
    return value


# name -> dataclass for nested (envelope-less) structures such as Sample.
NESTED: dict[str, type] = {}
# schema name -> message dataclass.
SCHEMAS: dict[str, type] = {}


def register_nested(cls: type) -> type:
    NESTED[cls.__name__] = cls
    return cls


def register_message(cls: type) -> type:
    SCHEMAS[cls.SCHEMA] = cls
    return cls


def _field_specs(cls: type) -> list[tuple[str, str, bool]]:
    """(name, type code, required) of a message dataclass, from its `metadata={"wire": code}`."""
    cached = cls.__dict__.get("_wire_specs")
    if cached is not None:
        return cached
    specs = []
    for f in dataclasses.fields(cls):
        if f.name == "extra":
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        specs.append((f.name, f.metadata["wire"], required))
    cls._wire_specs = specs
    return specs


def encode_fields(obj: Any) -> dict:
    cls = type(obj)
    out: dict[str, Any] = dict(obj.extra) if obj.extra else {}
    for name, code, _ in _field_specs(cls):
        out[name] = encode_value(getattr(obj, name), code)
    return out


def decode_fields(cls: type, data: dict, where: str) -> Any:
    kwargs: dict[str, Any] = {}
    for name, code, required in _field_specs(cls):
        if name in data:
            kwargs[name] = decode_value(data[name], code, f"{where}.{name}")
        elif required:
            raise DecodeError(f"{where}.{name}", "required field is missing")
    known = cls.__dict__["_wire_names"] if "_wire_names" in cls.__dict__ else None
    if known is None:
        known = {n for n, _, _ in _field_specs(cls)} | {"schema", "v"}
        cls._wire_names = known
    extra = {k: v for k, v in data.items() if k not in known}
    for k in extra:
        if not isinstance(k, str):
            raise DecodeError(where, f"map key {k!r} is not a string")
    obj = cls(**kwargs, extra=extra)
    check = getattr(obj, "validate", None)
    if check is not None:
        problem = check()
        if problem:
            raise DecodeError(where + problem[0], problem[1])
    return obj


def to_wire(msg: Any) -> dict:
    """The message as the plain map that goes on the wire (arrays packed)."""
    out = encode_fields(msg)
    out["schema"] = msg.SCHEMA
    out["v"] = msg.V
    return out


def encode(msg: Any) -> bytes:
    """Encode a registered message dataclass to msgpack bytes."""
    return msgpack.packb(to_wire(msg), use_bin_type=True)


def decode(data: bytes, expect: type | tuple[type, ...] | None = None) -> Any:
    """Decode msgpack bytes into the registered message they name; strict, raising DecodeError.

    `expect` restricts which message types are acceptable on this subject.
    """
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for truncated / garbage input
        raise DecodeError("message", f"not valid msgpack ({type(exc).__name__}: {exc})") from None
    return from_wire(raw, expect)


def from_wire(raw: Any, expect: type | tuple[type, ...] | None = None) -> Any:
    if not isinstance(raw, dict):
        raise DecodeError("message", f"expected a msgpack map, got {type(raw).__name__}")
    schema = raw.get("schema")
    if not isinstance(schema, str):
        raise DecodeError("message.schema", "missing or not a string")
    cls = SCHEMAS.get(schema)
    if cls is None:
        raise DecodeError("message.schema", f"unknown schema {schema!r} (known: {', '.join(sorted(SCHEMAS))})")
    if expect is not None:
        allowed = expect if isinstance(expect, tuple) else (expect,)
        if cls not in allowed:
            names = ", ".join(c.SCHEMA for c in allowed)
            raise DecodeError("message.schema", f"got {schema}, expected {names} on this subject")
    v = raw.get("v")
    if isinstance(v, bool) or not isinstance(v, int):
        raise DecodeError(f"{schema}.v", "missing or not an integer")
    if v > cls.V:
        raise DecodeError(
            f"{schema}.v", f"schema version {v} is newer than this reader's {cls.V}: upgrade jetrl on this service"
        )
    if v < 1:
        raise DecodeError(f"{schema}.v", f"schema version {v} is invalid (versions start at 1)")
    return decode_fields(cls, raw, schema)
