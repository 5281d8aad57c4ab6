"""msgpack codec for jetrl messages: strict decoding, packed arrays, schema versions.

Wire form of every message: a msgpack map with `schema` (message name), `v` (major schema version,
an int) and the message's fields. Token ids, masks, logprobs and versions travel as packed
little-endian bytes (int32 / uint8 / float32), which keeps a 2k-token sample near 24 KB and costs
microseconds to encode (measured: the same fields as a msgpack list of ints are ~45x slower).

Versioning: additive changes (a new optional field) keep `v`; a receiver keeps fields it does not
know in `extra` and writes them back on re-encode, so a relay never loses them. A change that breaks
old readers bumps `v`; a reader refuses a message whose `v` is newer than the one it knows.

Speed: each message class is compiled once (on first use) into a table of per-field encoder and
decoder functions, so no `dataclasses.fields` or type-code parsing happens per message. Decoders
raise a private `_Bad` carrying a path relative to the value; the levels above prepend their field
name or list index only on the error path, and the public functions turn it into `DecodeError`
("TrajectoryGroup.samples[0].tokens: ..."). Decoded arrays are read-only views of the message bytes
(np.frombuffer, zero copy); `.copy()` one to modify it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
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
        self.schema = schema
        self.size = size
        self.limit = limit
        self.subject = subject


class _Bad(Exception):
    """Internal: a decode failure at `path` (relative to the value being decoded)."""

    def __init__(self, reason: str, path: str = ""):
        self.reason = reason
        self.path = path


def _array_decoder(kind: str) -> Callable[[Any], np.ndarray]:
    dtype = ARRAY_DTYPES[kind]
    size = dtype.itemsize

    def dec(raw: Any) -> np.ndarray:
        if type(raw) is not bytes and not isinstance(raw, (bytes, bytearray, memoryview)):
            raise _Bad(f"expected packed {kind} bytes, got {type(raw).__name__}")
        if len(raw) % size:
            raise _Bad(f"{len(raw)} bytes is not a whole number of {kind} items ({size} bytes each)")
        return np.frombuffer(raw, dtype=dtype)

    return dec


_ARRAY_DECODERS = {kind: _array_decoder(kind) for kind in ARRAY_DTYPES}

# --- scalar decoders (each: value -> value, or raise _Bad) ------------------------------------------


def _got(value: Any) -> str:
    return type(value).__name__


def _dec_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise _Bad(f"expected str, got {_got(v)}")


def _dec_int(v: Any) -> int:
    if type(v) is int:
        return v
    # bool is an int subclass in Python, but never a valid int/float on our wire.
    if isinstance(v, bool):
        raise _Bad("expected int, got bool")
    if isinstance(v, int):
        return int(v)
    raise _Bad(f"expected int, got {_got(v)}")


def _dec_float(v: Any) -> float:
    if type(v) is float:
        return v
    if isinstance(v, bool):
        raise _Bad("expected float, got bool")
    if isinstance(v, (float, int)):
        return float(v)
    raise _Bad(f"expected float, got {_got(v)}")


def _dec_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    raise _Bad(f"expected bool, got {_got(v)}")


def _dec_bytes(v: Any) -> bytes:
    if type(v) is bytes:
        return v
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    raise _Bad(f"expected bytes, got {_got(v)}")


def _dec_map(v: Any) -> dict:
    if isinstance(v, dict):
        return v
    raise _Bad(f"expected map, got {_got(v)}")


def _dec_list(v: Any) -> list:
    if type(v) is list:
        return v
    if isinstance(v, (list, tuple)):
        return list(v)
    raise _Bad(f"expected list, got {_got(v)}")


def _dec_any(v: Any) -> Any:
    return v


_SCALAR_DECODERS: dict[str, Callable[[Any], Any]] = {
    "str": _dec_str,
    "int": _dec_int,
    "float": _dec_float,
    "bool": _dec_bool,
    "bytes": _dec_bytes,
    "map": _dec_map,
    "list": _dec_list,
    "any": _dec_any,
}


# --- per-class compiled tables ----------------------------------------------------------------------

# name -> dataclass for nested (envelope-less) structures such as Sample.
NESTED: dict[str, type] = {}
# schema name -> message dataclass.
SCHEMAS: dict[str, type] = {}

_MISSING = object()


class _Compiled:
    """Encoder/decoder of one message class, built once from its `metadata={"wire": code}`.

    `decode(data, envelope)` and `encode(obj)` are generated Python functions with the field names
    and the common type checks written out (`type(v) is str`, packed arrays straight to
    np.frombuffer); anything else (a subclass, an optional, a list, a nested structure, an error)
    goes to the general per-code function, so both paths accept and refuse exactly the same input.
    """

    __slots__ = ("cls", "specs", "names", "known", "known_envelope", "decode", "encode", "source")

    def __init__(self, cls: type):
        self.cls = cls
        self.specs: list[tuple[str, str, bool]] = []
        ns: dict[str, Any] = {"_Bad": _Bad, "_MISSING": _MISSING, "_new": cls.__new__, "_cls": cls,
                              "_frombuffer": np.frombuffer, "_ndarray": np.ndarray, "_extras": self._extras}
        dec_lines = ["def decode(data, envelope):", "    get = data.get", "    found = 2 if envelope else 0"]
        enc_lines = ["def encode(obj):", "    d = obj.__dict__", "    out = {"]
        values = []
        for i, f in enumerate(dataclasses.fields(cls)):
            if f.name == "extra":
                continue
            name, code = f.name, f.metadata["wire"]
            has_factory = f.default_factory is not dataclasses.MISSING
            required = f.default is dataclasses.MISSING and not has_factory
            self.specs.append((name, code, required))
            ns[f"dec{i}"] = _decoder(code)
            if has_factory:
                ns[f"factory{i}"] = f.default_factory
                missing = f"v = factory{i}()"
            elif required:
                missing = f"raise _Bad('required field is missing', {'.' + name!r})"
            else:
                ns[f"default{i}"] = f.default
                missing = f"v = default{i}"
            dec_lines += [f"    v = get({name!r}, _MISSING)", "    if v is _MISSING:", f"        {missing}",
                          "    else:", "        found += 1", "        try:"]
            if code in ARRAY_DTYPES:
                ns[f"dtype{i}"] = ARRAY_DTYPES[code]
                dec_lines += [f"            if type(v) is bytes and not len(v) % {ARRAY_DTYPES[code].itemsize}:",
                              f"                v = _frombuffer(v, dtype{i})", "            else:",
                              f"                v = dec{i}(v)"]
            elif code in _EXACT_TYPES:
                ns[f"type{i}"] = _EXACT_TYPES[code]
                dec_lines += [f"            if type(v) is not type{i}:", f"                v = dec{i}(v)"]
            elif code != "any":
                dec_lines += [f"            v = dec{i}(v)"]
            else:
                dec_lines += ["            pass"]
            dec_lines += ["        except _Bad as bad:", f"            bad.path = {'.' + name!r} + bad.path",
                          "            raise", f"    f{i} = v"]
            values.append(f"{name!r}: f{i}")
            enc = _encoder(code)
            if enc is None:
                enc_lines.append(f"        {name!r}: d[{name!r}],")
            elif code in ARRAY_DTYPES:
                ns[f"enc{i}"], ns[f"dtype{i}"] = enc, ARRAY_DTYPES[code]
                enc_lines.append(f"        {name!r}: v.tobytes() if type(v := d[{name!r}]) is _ndarray "
                                 f"and v.dtype is dtype{i} else enc{i}(v),")
            else:
                ns[f"enc{i}"] = enc
                enc_lines.append(f"        {name!r}: enc{i}(d[{name!r}]),")
        dec_lines += ["    extra = _extras(data, envelope) if len(data) > found else {}",
                      "    obj = _new(_cls)", f"    obj.__dict__.update({{{', '.join(values)}, 'extra': extra}})"]
        if callable(getattr(cls, "validate", None)):
            dec_lines += ["    problem = obj.validate()", "    if problem:", "        raise _Bad(problem[1], problem[0])"]
        dec_lines.append("    return obj")
        enc_lines.append("    }")
        enc_lines += ["    extra = d.get('extra')", "    if extra:", "        out = {**extra, **out}", "    return out"]
        self.source = "\n".join(dec_lines) + "\n\n" + "\n".join(enc_lines) + "\n"
        exec(compile(self.source, f"<jetrl codec for {cls.__name__}>", "exec"), ns)
        self.decode, self.encode = ns["decode"], ns["encode"]
        self.names = tuple(n for n, _, _ in self.specs)
        self.known = frozenset(self.names)  # a nested structure: `schema`/`v` would be unknown fields
        self.known_envelope = self.known | {"schema", "v"}

    def _extras(self, data: dict, envelope: bool) -> dict:
        """The keys of `data` that are not fields of this class (kept in `extra`, written back on encode)."""
        known = self.known_envelope if envelope else self.known
        extra = {}
        for k, v in data.items():
            if k not in known:
                if not isinstance(k, str):
                    raise _Bad(f"map key {k!r} is not a string")
                extra[k] = v
        return extra


# Wire codes whose decoded value is exactly this Python type in the common case.
_EXACT_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "bytes": bytes, "map": dict, "list": list}


_COMPILED: dict[type, _Compiled] = {}


def _compiled(cls: type) -> _Compiled:
    comp = _COMPILED.get(cls)
    if comp is None:
        comp = _COMPILED[cls] = _Compiled(cls)
    return comp


def _decoder(code: str) -> Callable[[Any], Any]:
    if code.endswith("?"):
        inner = _decoder(code[:-1])

        def optional(v: Any) -> Any:
            return None if v is None else inner(v)

        return optional
    if code in _ARRAY_DECODERS:
        return _ARRAY_DECODERS[code]
    if code in _SCALAR_DECODERS:
        return _SCALAR_DECODERS[code]
    if code.startswith("list[") and code.endswith("]"):
        item = _decoder(code[5:-1])

        def list_of(v: Any) -> list:
            if not isinstance(v, (list, tuple)):
                raise _Bad(f"expected list, got {_got(v)}")
            out = []
            for i, x in enumerate(v):
                try:
                    out.append(item(x))
                except _Bad as bad:
                    bad.path = f"[{i}]{bad.path}"
                    raise
            return out

        return list_of
    if code in NESTED:
        cls = NESTED[code]

        def nested(v: Any) -> Any:
            if not isinstance(v, dict):
                raise _Bad(f"expected a {code} map, got {_got(v)}")
            return _compiled(cls).decode(v, False)

        return nested
    raise TypeError(f"unknown field type code {code!r}")  # a bug in a schema definition, not bad input


def _encoder(code: str) -> Callable[[Any], Any] | None:
    """The function turning a field value into its wire value, or None when it goes on the wire as is."""
    optional = code.endswith("?")
    base = code[:-1] if optional else code
    if base in ARRAY_DTYPES:
        dtype = ARRAY_DTYPES[base]

        def enc(v: Any) -> bytes:
            if type(v) is np.ndarray and v.dtype is dtype:
                return v.tobytes()
            return np.ascontiguousarray(v, dtype=dtype).tobytes()

    elif base.startswith("list[") and base.endswith("]"):
        item = _encoder(base[5:-1])
        if item is None:

            def enc(v: Any) -> list:
                return list(v)

        else:

            def enc(v: Any) -> list:
                return [item(x) for x in v]

    elif base in NESTED:

        def enc(v: Any) -> dict:
            return encode_fields(v)

    elif base in _SCALAR_DECODERS:
        return None
    else:
        raise TypeError(f"unknown field type code {code!r}")  # a bug in a schema definition
    if not optional:
        return enc
    return lambda v: None if v is None else enc(v)


def register_nested(cls: type) -> type:
    NESTED[cls.__name__] = cls
    return cls


def register_message(cls: type) -> type:
    SCHEMAS[cls.SCHEMA] = cls
    return cls


def _field_specs(cls: type) -> list[tuple[str, str, bool]]:
    """(name, type code, required) of a message dataclass, from its `metadata={"wire": code}`."""
    return _compiled(cls).specs


# --- public API -------------------------------------------------------------------------------------


def encode_fields(obj: Any) -> dict:
    """The wire map of a message or nested structure, without `schema`/`v` (unknown fields first)."""
    comp = _COMPILED.get(type(obj)) or _compiled(type(obj))
    return comp.encode(obj)


def to_wire(msg: Any) -> dict:
    """The message as the plain map that goes on the wire (arrays packed)."""
    out = encode_fields(msg)
    out["schema"] = msg.SCHEMA
    out["v"] = msg.V
    return out


_packb = msgpack.packb
_unpackb = msgpack.unpackb


def encode(msg: Any) -> bytes:
    """Encode a registered message dataclass to msgpack bytes."""
    return _packb(to_wire(msg), use_bin_type=True)


def decode(data: bytes, expect: type | tuple[type, ...] | None = None) -> Any:
    """Decode msgpack bytes into the registered message they name; strict, raising DecodeError.

    `expect` restricts which message types are acceptable on this subject.
    """
    try:
        raw = _unpackb(data, raw=False, strict_map_key=True)
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
    if expect is not None and cls is not expect:
        allowed = expect if isinstance(expect, tuple) else (expect,)
        if cls not in allowed:
            names = ", ".join(c.SCHEMA for c in allowed)
            raise DecodeError("message.schema", f"got {schema}, expected {names} on this subject")
    v = raw.get("v")
    if type(v) is not int:
        raise DecodeError(f"{schema}.v", "missing or not an integer")
    if v > cls.V:
        raise DecodeError(
            f"{schema}.v", f"schema version {v} is newer than this reader's {cls.V}: upgrade jetrl on this service"
        )
    if v < 1:
        raise DecodeError(f"{schema}.v", f"schema version {v} is invalid (versions start at 1)")
    try:
        return _compiled(cls).decode(raw, True)
    except _Bad as bad:
        raise DecodeError(schema + bad.path, bad.reason) from None
