"""Bearer-token authentication for jetrl's HTTP services, checked before a request body is read.

`BearerAuth` is plain ASGI middleware: it looks at the `Authorization` header of every HTTP request
whose path it protects and answers 401 (no or malformed header) or 403 (wrong token) *before* the app
sees the request, so an unauthenticated client cannot make a service read (or spool to disk) a large
body. FastAPI dependencies run only after the body of a form or JSON parameter has been read, which is
why this is middleware. Tokens are compared in constant time.

`check_auth_setting` is the start-up rule every service follows: a token is required unless the
config says `insecure_no_auth: true`, and then a warning is logged.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Iterable

log = logging.getLogger("jetrl.auth")


class AuthConfigError(ValueError):
    """A service was asked to start without a token and without an explicit opt-out."""


def check_auth_setting(token: str, insecure_no_auth: bool, section: str, what: str) -> bool:
    """True when requests must carry a token. Raises AuthConfigError naming the fields when neither a
    token nor `<section>.insecure_no_auth: true` is configured; logs a warning for the opt-out."""
    if token:
        return True
    if insecure_no_auth:
        log.warning("%s runs WITHOUT authentication (%s.insecure_no_auth: true): anyone who can reach its port "
                    "can use it; set %s.token (or %s.token_file) instead", what, section, section, section)
        return False
    raise AuthConfigError(
        f"{section}.token: {what} needs a bearer token: set {section}.token_file (a file holding it, mode 0600) "
        f"or {section}.token (or JETRL__{section.upper()}__TOKEN); `jetrl up` generates one per run. To serve "
        f"without authentication set {section}.insecure_no_auth: true (logged as a warning)")


def token_matches(header: str, want: str) -> bool | None:
    """None: no usable `Bearer <token>` header; else whether it carries `want` (constant time)."""
    scheme, _, got = (header or "").partition(" ")
    got = got.strip()
    if scheme.lower() != "bearer" or not got:
        return None
    return hmac.compare_digest(got.encode(), want.encode())


def bearer_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


Refusal = Callable[[int, str], tuple[bytes, str]]  # (status, message) -> (body, content type)


def _json_refusal(status: int, message: str) -> tuple[bytes, str]:
    return json.dumps({"detail": message, "errors": []}).encode(), "application/json"


class BearerAuth:
    """ASGI middleware: requests to protected paths need `Authorization: Bearer <token>`.

    tokens(kind) returns the tokens accepted for a request of `kind` ("read" for GET/HEAD/OPTIONS, else
    "write"); an empty list lets the request through (no auth for that kind). `open_paths` are exact
    paths or prefixes ending in "/" that never need a token (health checks, static assets)."""

    def __init__(self, app, tokens: Callable[[str], list[str]], open_paths: Iterable[str] = (),
                 open_prefixes: Iterable[str] = (),
                 refusal: Refusal = _json_refusal, realm: str = "jetrl", wrong_status: int = 403):
        self.app = app
        self.tokens = tokens
        self.open_exact = set(open_paths)
        self.open_prefix = tuple(open_prefixes)
        self.refusal = refusal
        self.realm = realm
        self.wrong_status = wrong_status

    def _open(self, path: str) -> bool:
        return path in self.open_exact or path.startswith(self.open_prefix)

    def wanted(self, scope, kind: str) -> list[str]:
        """The tokens that admit this request ([] = no auth); subclasses may look at the path."""
        return [t for t in self.tokens(kind) if t]

    def refusal_for(self, scope) -> Refusal:
        """How a refusal of this request is written; subclasses may look at the path (an API's error shape)."""
        return self.refusal

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or self._open(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        kind = "read" if scope.get("method", "GET") in ("GET", "HEAD", "OPTIONS") else "write"
        wanted = self.wanted(scope, kind)
        if not wanted:
            await self.app(scope, receive, send)
            return
        header = ""
        for k, v in scope.get("headers") or ():
            if k == b"authorization":
                header = v.decode("latin-1")
                break
        results = [token_matches(header, t) for t in wanted]
        if any(results):
            await self.app(scope, receive, send)
            return
        if results[0] is None:
            status, msg = 401, "missing bearer token: send 'Authorization: Bearer <token>'"
        else:
            status, msg = self.wrong_status, "the bearer token is not valid for this request"
        body, ctype = self.refusal_for(scope)(status, msg)
        headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        if status == 401:
            headers.append((b"www-authenticate", f'Bearer realm="{self.realm}"'.encode()))
        # The body is never read: the connection is closed after this answer.
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


class RefuseControlChars:
    """ASGI middleware: a request path holding a control character (a decoded %0A, %00, ...) is a 400.
    Starlette's route patterns end in `$`, which matches before a trailing newline, so `files/a.bin%0A`
    would otherwise reach a handler as `a.bin`."""

    def __init__(self, app, refusal: Refusal = _json_refusal):
        self.app, self.refusal = app, refusal

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if any(ord(c) < 32 or ord(c) == 127 for c in path):
            body, ctype = self.refusal(400, "the request path holds a control character (newline, NUL, ...): "
                                            "use plain names")
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode()),
                                    (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
