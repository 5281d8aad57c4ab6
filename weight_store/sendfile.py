"""Download bodies: `FileRangeResponse` sends a byte range of an open file, zero-copy with os.sendfile on
the connection's socket when uvicorn runs `http_protocol()`'s protocol, else in large chunks read ahead
in a thread. Either way it stops early when the reader goes away, and calls `on_done` however it ended
(the download no longer holds its version against retention)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from starlette.responses import Response

from weight_store.state import Metrics

SENDFILE_EXTENSION = "jetrl.sendfile"


class FileRangeResponse(Response):
    """Sends bytes [start, end) of an open file in large chunks, read ahead in a thread."""

    def __init__(self, fd: int, start: int, end: int, status: int, headers: dict, chunk: int, head: bool,
                 metrics: Metrics, on_done: Callable[[], None]) -> None:
        super().__init__(status_code=status, headers=headers)
        self.fd, self.start, self.end, self.chunk, self.head = fd, start, end, chunk, head
        self.metrics, self.on_done = metrics, on_done

    async def __call__(self, scope, receive, send) -> None:
        gone = asyncio.Event()

        async def watch_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch_disconnect())
        loop = asyncio.get_running_loop()
        nxt: asyncio.Future | None = None
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            pos = self.start
            if self.head or pos >= self.end:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            cycle = scope.get("extensions", {}).get(SENDFILE_EXTENSION, {}).get("cycle")
            if cycle is not None:
                sent = await self._sendfile(loop, cycle, gone)
                if sent is not None:
                    if sent == self.end - self.start:
                        await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
            nxt = loop.run_in_executor(None, os.pread, self.fd, min(self.chunk, self.end - pos), pos)
            while pos < self.end and not gone.is_set():
                data = await nxt
                nxt = None
                if not data:
                    raise RuntimeError("file shrank while being served")
                pos += len(data)
                if pos < self.end:
                    nxt = loop.run_in_executor(None, os.pread, self.fd, min(self.chunk, self.end - pos), pos)
                await send({"type": "http.response.body", "body": data, "more_body": pos < self.end})
                self.metrics.bytes_out.inc(len(data))
        finally:
            watcher.cancel()
            if nxt is not None:
                await asyncio.gather(nxt, return_exceptions=True)
            os.close(self.fd)
            self.on_done()

    async def _sendfile(self, loop, cycle, gone: asyncio.Event) -> int | None:
        """Zero-copy body via os.sendfile on the connection's socket (SendfileHttpToolsProtocol).

        Returns the bytes sent, or None when sendfile is not available here (nothing was sent)."""
        f = open(self.fd, "rb", buffering=0, closefd=False)
        pos = self.start
        try:
            while pos < self.end and not gone.is_set():
                count = min(64 << 20, self.end - pos)
                try:
                    n = await loop.sendfile(cycle.transport, f, pos, count, fallback=False)
                except (NotImplementedError, RuntimeError, asyncio.SendfileNotAvailableError):
                    if pos == self.start:
                        return None  # e.g. uvloop: use the chunked path
                    raise
                except OSError:  # the reader went away
                    break
                pos += n
                cycle.expected_content_length -= n  # uvicorn counts the body bytes it framed itself
                self.metrics.bytes_out.inc(n)
                self.metrics.sendfile_out.inc(n)
        finally:
            f.close()
        return pos - self.start


def http_protocol():
    """uvicorn's httptools protocol, extended so downloads can use os.sendfile; h11 without httptools."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "h11"

    class SendfileHttpToolsProtocol(HttpToolsProtocol):
        """Puts the request's cycle (its transport and Content-Length bookkeeping) into the ASGI
        scope, for FileRangeResponse to send file bytes with loop.sendfile instead of copies."""

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            cycle = getattr(self, "cycle", None)
            if cycle is not None and hasattr(cycle, "transport") and hasattr(cycle, "expected_content_length"):
                self.scope.setdefault("extensions", {})[SENDFILE_EXTENSION] = {"cycle": cycle}

    return SendfileHttpToolsProtocol
