"""Secrets in configs: read from files, written 0600, never dumped.

A secret config field (`Field(..., json_schema_extra={"secret": True})`, e.g. `controller.token`) can be
given inline or, better, as a file named by its `<field>_file` twin (`controller.token_file`), so neither
a config file nor a command line holds it. `Section.secret(name)` returns the value from either.
Dumps of a config (`jetrl config show`, the run config the controller stores) replace every set secret
with REDACTED; loading a config that still holds REDACTED is an error, so a redacted dump can never run
with a guessable token.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import Any

REDACTED = "<redacted>"


class SecretFileError(ValueError):
    pass


def new_token(nbytes: int = 32) -> str:
    """A fresh random token: a letter, then URL-safe text of `nbytes` of entropy.

    The leading letter makes every token safe where nats-server reads it from the environment
    (`password: $JETRL_NATS_PASSWORD_ROLLOUT` in compose/nats.conf): nats-server parses a variable's value
    as a config value, so one that begins with "-" or a digit ("1-2..." reads as a date) can be a parse
    error, and the server does not start (tests/shared/test_nats_permissions.py).
    """
    return "t" + secrets.token_urlsafe(nbytes)


def write_private(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` readable by its owner only (0600, also when the file existed)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    return p


def check_private(path: str | os.PathLike, field: str) -> Path:
    """`path` (user-expanded) if only its owner may read or write it; SecretFileError naming `field` otherwise
    (unreadable, or a group / other permission bit set)."""
    p = Path(path).expanduser()
    try:
        mode = stat.S_IMODE(p.stat().st_mode)
    except OSError as exc:
        raise SecretFileError(f"{field}: cannot read {str(path)!r}: {exc.strerror}") from None
    if mode & 0o077:
        raise SecretFileError(f"{field}: {str(path)!r} is readable by others (mode {mode:04o}); chmod 600 it")
    return p


def read_secret(path: str | os.PathLike, field: str) -> str:
    """The secret held by a file (surrounding whitespace stripped); an error naming `field` otherwise."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretFileError(f"{field}: cannot read {str(path)!r}: {exc.strerror if isinstance(exc, OSError) else exc}"
                              ) from None
    if not text:
        raise SecretFileError(f"{field}: {str(path)!r} is empty")
    return text


def secret_fields(model_cls) -> list[str]:
    """Names of the fields of a pydantic model class marked secret."""
    out = []
    for name, f in model_cls.model_fields.items():
        extra = f.json_schema_extra
        if isinstance(extra, dict) and extra.get("secret"):
            out.append(name)
    return out


def redacted_dump(model, placeholder: str = REDACTED) -> dict[str, Any]:
    """`model.model_dump(mode="json")` with every non-empty secret field replaced by `placeholder`
    (REDACTED; "" drops the secrets, for a config sent where they are not needed)."""
    from pydantic import BaseModel

    data = model.model_dump(mode="json")

    def walk(m: BaseModel, d: dict) -> None:
        for name in secret_fields(type(m)):
            if d.get(name):
                d[name] = placeholder
        for name in type(m).model_fields:
            v = getattr(m, name)
            if isinstance(v, BaseModel) and isinstance(d.get(name), dict):
                walk(v, d[name])

    walk(model, data)
    return data
