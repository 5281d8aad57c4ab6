"""Blocking HTTP/1.1 transfers for the weight client: big buffers straight between socket and file.

Generic HTTP clients read a body in 64 KiB pieces through a parser (~130-300 MB/s here, 5-12x slower
than `cp`: docs/weight_store.md); this module sends the request itself and then moves the body with
`recv_into` / `sendall` on 8 MiB buffers (the digests on the same buffers), so the copy runs near memory
speed. Only Content-Length bodies (what the weight store sends) are supported. The async client runs
these functions in threads (hashing and socket I/O release the GIL, so parallel files overlap).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import quote, urlsplit

from weight_store.manifest import new_hasher


class WeightStoreError(Exception):
    """The store refused a request: `status` (HTTP), `code` and `message` from its JSON error body."""

    def __init__(self, status: int, code: str, message: str, url: str = ""):
        super().__init__(f"{status} {code}: {message}" + (f" ({url})" if url else ""))
        self.status, self.code, self.message, self.url = status, code, message, url


class TransferError(OSError):
    """The connection failed or was cut (retryable)."""


class DigestMismatch(WeightStoreError):
    def __init__(self, url: str, want: str, got: str, algo: str = "sha256"):
        super().__init__(0, "digest_mismatch", f"{algo} of the downloaded bytes is {got}, the manifest says {want}",
                         url)


Buffers = Callable[[], Iterable[memoryview | bytes]]


def file_url(base: str, run: str, version: int, name: str) -> str:
    return f"{base.rstrip('/')}/v1/runs/{quote(run)}/versions/{version}/files/{quote(name)}"


class _Conn:
    """One request on a fresh connection (loopback connects cost ~0.1 ms, so no pooling)."""

    def __init__(self, url: str, timeout: float):
        u = urlsplit(url)
        if u.scheme != "http":
            raise ValueError(f"weight store url {url!r}: only http:// is supported")
        self.url, self.host, self.port = url, u.hostname or "127.0.0.1", u.port or 80
        self.target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        self.sock = socket.create_connection((self.host, self.port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def send_head(self, method: str, headers: dict[str, str]) -> None:
        lines = [f"{method} {self.target} HTTP/1.1", f"Host: {self.host}:{self.port}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    def read_head(self) -> tuple[int, dict[str, str]]:
        while b"\r\n\r\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise TransferError(f"connection closed before a response from {self.url}")
            self.buf += data
            if len(self.buf) > 1 << 20:
                raise TransferError(f"response head from {self.url} is too large")
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise TransferError(f"bad status line {lines[0]!r} from {self.url}")
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        return int(parts[1]), headers

    def read_body(self, headers: dict[str, str], limit: int = 64 << 20) -> bytes:
        n = int(headers.get("content-length", "-1"))
        if n < 0:
            chunks = [self.buf]
            while data := self.sock.recv(1 << 20):
                chunks.append(data)
            return b"".join(chunks)[:limit]
        if n > limit:
            raise TransferError(f"response body of {n} bytes from {self.url} exceeds {limit}")
        while len(self.buf) < n:
            data = self.sock.recv(max(65536, n - len(self.buf)))
            if not data:
                raise TransferError(f"connection cut after {len(self.buf)} of {n} body bytes from {self.url}")
            self.buf += data
        body, self.buf = self.buf[:n], self.buf[n:]
        return body


def _raise_for(status: int, body: bytes, url: str) -> None:
    try:
        err = json.loads(body)
        code, message = str(err.get("error", "http_error")), str(err.get("message", err))
    except (ValueError, AttributeError):
        code, message = "http_error", body[:500].decode(errors="replace")
    raise WeightStoreError(status, code, message, url)


def request(method: str, url: str, headers: dict[str, str] | None = None, body: bytes | None = None,
            timeout: float = 60.0) -> tuple[int, dict[str, str], bytes]:
    """A small request (JSON API): returns (status, headers, body); raises WeightStoreError on >= 400."""
    conn = _Conn(url, timeout)
    try:
        h = dict(headers or {})
        if body is not None:
            h.setdefault("Content-Type", "application/json")
            h["Content-Length"] = str(len(body))
        conn.send_head(method, h)
        if body:
            conn.sock.sendall(body)
        status, rh = conn.read_head()
        data = conn.read_body(rh)
    except OSError as exc:
        raise exc if isinstance(exc, TransferError) else TransferError(f"{method} {url}: {exc}") from exc
    finally:
        conn.close()
    if status >= 400:
        _raise_for(status, data, url)
    return status, rh, data


def put_stream(url: str, buffers: Buffers, size: int, headers: dict[str, str], timeout: float) -> tuple[dict, str]:
    """PUT `size` bytes from `buffers()` (sha256 computed while sending); returns (json reply, sha256).

    Sends `Expect: 100-continue`, so a refusal (auth, name, size) arrives before any body byte is sent.
    """
    conn = _Conn(url, timeout)
    try:
        conn.send_head("PUT", {**headers, "Content-Length": str(size), "Expect": "100-continue",
                               "Content-Type": "application/octet-stream"})
        status, rh = conn.read_head()
        if status != 100:
            _raise_for(status, conn.read_body(rh), url)
        h, sent = hashlib.sha256(), 0
        for buf in buffers():
            h.update(buf)
            conn.sock.sendall(buf)
            sent += len(buf)
        if sent != size:
            raise ValueError(f"upload of {url}: produced {sent} bytes, declared {size}")
        status, rh = conn.read_head()
        body = conn.read_body(rh)
    except WeightStoreError:
        raise
    except OSError as exc:
        raise exc if isinstance(exc, TransferError) else TransferError(f"PUT {url}: {exc}") from exc
    finally:
        conn.close()
    if status >= 400:
        _raise_for(status, body, url)
    return json.loads(body), h.hexdigest()


def file_buffers(path: Path, chunk: int) -> Buffers:
    def gen():
        buf = bytearray(chunk)
        mv = memoryview(buf)
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(mv):
                yield mv[:n]

    return gen


class _Digest:
    """The digest (manifest.new_hasher) of a file being written, kept in step with its bytes; None: off."""

    def __init__(self, algo: str | None):
        self.algo = algo
        self.h = new_hasher(algo) if algo else None

    def reset(self) -> None:
        self.h = new_hasher(self.algo) if self.algo else None

    def update(self, data) -> None:
        if self.h is not None:
            self.h.update(data)

    def hexdigest(self) -> str:
        return self.h.hexdigest() if self.h is not None else ""


def get_file(url: str, dest: Path, size: int, sha256: str, *, headers: dict[str, str], chunk: int,
             timeout: float, retries: int, check: tuple[str, str] | None) -> None:
    """Download `url` into `dest` (exactly `size` bytes), resuming a partial `dest` with a Range
    request after a cut connection (up to `retries` times). `sha256` is the file's ETag; `check` is
    (algorithm, hex) to verify the bytes against (manifest.file_digest), None to skip it."""
    digest = _Digest(check[0] if check else None)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and dest.stat().st_size <= size:  # a partial file from an earlier try
        for piece in file_buffers(dest, chunk)():
            digest.update(piece)
    else:
        dest.unlink(missing_ok=True)
    attempt = 0
    while True:
        have = dest.stat().st_size if dest.exists() else 0
        try:
            if have < size:
                _get_range(url, dest, have, size, headers, f'"{sha256}"', chunk, timeout, digest)
            break
        except TransferError:
            attempt += 1
            if attempt > retries:
                raise
            time.sleep(min(0.1 * 2**attempt, 2.0))
    if check and digest.hexdigest() != check[1]:
        dest.unlink(missing_ok=True)
        raise DigestMismatch(url, check[1], digest.hexdigest(), check[0])


def _get_range(url: str, dest: Path, offset: int, size: int, headers: dict[str, str], etag: str, chunk: int,
               timeout: float, digest: _Digest) -> None:
    """GET bytes [offset, size) into `dest` at `offset`; digest and file stay in step even when cut."""
    conn = _Conn(url, timeout)
    fd = None
    try:
        req = dict(headers)
        if offset:
            req.update({"Range": f"bytes={offset}-", "If-Range": etag})
        conn.send_head("GET", req)
        status, rh = conn.read_head()
        if status >= 400:
            _raise_for(status, conn.read_body(rh), url)
        if status == 200 and offset:  # the file changed (If-Range): start over
            offset = 0
            digest.reset()
        elif status == 206:
            cr = rh.get("content-range", "")
            if not cr.startswith(f"bytes {offset}-"):
                raise TransferError(f"{url}: asked for bytes {offset}-, got Content-Range {cr!r}")
        elif status != 200:
            raise TransferError(f"{url}: unexpected status {status}")
        want = size - offset
        if int(rh.get("content-length", -1)) != want:
            raise TransferError(f"{url}: Content-Length {rh.get('content-length')} but {want} bytes expected")
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if offset == 0 else 0), 0o644)
        os.lseek(fd, offset, os.SEEK_SET)
        buf = bytearray(chunk)
        mv = memoryview(buf)
        first = conn.buf[:want]
        conn.buf = b""
        mv[: len(first)] = first
        digest.update(first)
        filled, got = len(first), 0
        try:
            while got + filled < want:
                n = conn.sock.recv_into(mv[filled:], min(chunk - filled, want - got - filled))
                if not n:
                    raise TransferError(f"{url}: connection cut after {offset + got + filled} of {size} bytes")
                # hashed as it arrives, while the piece is still in the CPU's cache (hashing the 8 MiB
                # buffer at write time read it back from memory: docs/benchmarks.md, weight fan-out)
                digest.update(mv[filled:filled + n])
                filled += n
                if filled == chunk:
                    _write_all(fd, mv[:filled])
                    got, filled = got + filled, 0
        finally:
            if filled:  # keep what arrived before a cut (hashed already): the resume continues from here
                _write_all(fd, mv[:filled])
    except OSError as exc:
        raise exc if isinstance(exc, TransferError) else TransferError(f"GET {url}: {exc}") from exc
    finally:
        if fd is not None:
            os.close(fd)
        conn.close()


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]
