"""Relay fan-out, the workers' side (`weights.fanout: relay`; the store's side is weight_store/routes/relay.py).

A worker that fetches a full version over HTTP joins the version's chain at the store and is told its
upstream: the worker that joined before it, or the store for the first. It takes the version piece by
piece (weight_store/pieces.py) from that upstream, `relay_window` pieces in flight, checks each
piece against the store's digest before it writes it, and serves every piece it has checked to the
worker after it from its own small HTTP server (`RelayNode`), so the version flows store -> w1 -> w2 ...
and each host forwards as it receives: the time to reach N workers is about one link's time plus N
pieces, not N copies out of the store.

When the upstream fails a piece (refused connection, no answer within `relay_timeout_s`, a piece whose
digest is wrong) the worker asks the store again naming it: the failed peer leaves the chain and the
worker gets the one before it. After `relay_max_failures` failures the rest comes from the store. Every
file is checked against the announced manifest at the end, as for any fetch (WeightStoreClient).

    GET /v1/relay/{run}/{version}/pieces/{index}   the piece's bytes, once this worker has checked it;
        waits up to relay_timeout_s / 2 for a piece still on its way (then 503); 404 for a version it
        does not hold. Bearer token: this worker's weights.read_token or weights.token, checked as the
        store checks them (weight_store/deps.py, check_token).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import xxhash
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from shared.config import WeightStoreConfig
from shared.runtime.netaddr import address_toward
from weight_store.deps import check_token
from weight_store.pieces import Piece, check_pieces
from weight_store.storage import StoreError
from weight_store.transfer import DigestMismatch, TransferError, WeightStoreError

log = logging.getLogger("jetrl.weights.relay")


class BadPiece(Exception):
    pass


class Holding:
    """The pieces of one version this worker has checked, readable from `dirs` (the download dir, then the
    cache dir it is renamed to)."""

    def __init__(self, pieces: list[Piece], dirs: list[Path]):
        self.pieces, self.dirs = pieces, dirs
        self.done = bytearray(len(pieces))
        self._changed = asyncio.Event()

    def mark(self, i: int) -> None:
        self.done[i] = 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self, i: int, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not self.done[i]:
            left = end - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return bool(self.done[i])
        return True

    def read(self, i: int) -> bytes:
        p = self.pieces[i]
        for d in self.dirs:
            try:
                fd = os.open(d / p.name, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                return os.pread(fd, p.length, p.offset)
            finally:
                os.close(fd)
        raise FileNotFoundError(p.name)


class RelayNode:
    """This worker's relay: the HTTP server that serves checked pieces, and the chained fetch."""

    def __init__(self, cfg: WeightStoreConfig):
        self.cfg = cfg
        self.held: dict[tuple[str, int], Holding] = {}
        self.url = ""
        self.stats = {"pieces_from_peers": 0, "pieces_from_store": 0, "peer_failures": 0, "bytes_served": 0}
        self._server = None
        self._task: asyncio.Task | None = None
        self._tokens = [t for t in (cfg.secret("read_token"), cfg.secret("token")) if t]

    # --- serving -----------------------------------------------------------------------------------

    async def start(self) -> str:
        """Start the relay server; returns the URL it is advertised at."""
        import uvicorn

        app = FastAPI(title="jetrl weight relay", docs_url=None, redoc_url=None, openapi_url=None)

        @app.get("/v1/relay/{run}/{version}/pieces/{index}")
        async def piece(run: str, version: str, index: str, request: Request):
            try:
                check_token(request, self._tokens)  # the store's own check: the same tokens, 401 / 403
            except StoreError as exc:
                return JSONResponse({"error": exc.code, "message": exc.message}, exc.status)
            h = self.held.get((run, int(version))) if version.isdigit() and len(version) <= 12 else None
            if h is None or not index.isdigit() or int(index) >= len(h.pieces):
                return JSONResponse({"error": "not_found", "message": "this relay does not hold that piece"}, 404)
            i = int(index)
            if not await h.wait(i, self.cfg.relay_timeout_s / 2):
                return JSONResponse({"error": "not_yet", "message": f"piece {i} is still on its way"}, 503)
            try:
                data = await asyncio.to_thread(h.read, i)
            except FileNotFoundError:
                self.held.pop((run, int(version)), None)
                return JSONResponse({"error": "not_found", "message": "this relay no longer holds it"}, 404)
            self.stats["bytes_served"] += len(data)
            return Response(data, media_type="application/octet-stream")

        port = self.cfg.relay_port
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.cfg.relay_host, port))
        port = sock.getsockname()[1]
        class Embedded(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):  # the process that embeds the relay owns SIGTERM / SIGINT
                yield

        self._server = Embedded(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                               loop="asyncio", log_config=None))
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)
        store = urlsplit(self.cfg.url).hostname or "127.0.0.1"
        self.url = self.cfg.relay_advertise or f"http://{address_toward(store)}:{port}"
        log.info("weight relay serving at %s", self.url)
        return self.url

    async def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._task is not None:
                await asyncio.gather(self._task, return_exceptions=True)
            self._server = None

    # --- fetching ----------------------------------------------------------------------------------

    async def fetch(self, client, run: str, version: int, manifest: dict, part: Path, dest: Path) -> bool:
        """Fetch `version`'s files into `part` through the chain; False when the store has no piece digests
        for it (the caller downloads it whole). Every piece is checked before it is written or served."""
        if not self.url:
            await self.start()
        vpath = client._vpath(run, version)
        try:
            pieces = check_pieces(await client._json("GET", vpath + "/pieces"), manifest)
        except WeightStoreError as exc:
            if exc.status == 404:
                return False
            raise
        except ValueError as exc:
            log.warning("run %s version %d: the store's piece list is unusable (%s); fetching from the store",
                        run, version, exc)
            return False
        for f in manifest["files"]:
            p = part / f["name"]
            p.parent.mkdir(parents=True, exist_ok=True)
            with open(p, "ab") as fh:
                fh.truncate(f["size"])
        h = Holding(pieces, [part, dest])
        for key in [k for k in self.held if k[0] == run and k[1] < version - 1]:
            del self.held[key]  # the cache keeps the newest few; older holdings would only answer 404
        self.held[(run, version)] = h
        state = {"upstream": await self._join(client, vpath, []), "failures": 0}
        lock = asyncio.Lock()
        todo = iter(pieces)
        headers = client._headers(False)

        async def get(http: httpx.AsyncClient, src: str | None, p: Piece) -> bytes:
            if src is None:
                url = f"{client.base}{vpath}/files/{quote(p.name)}"
                hdr = {**headers, "Range": f"bytes={p.offset}-{p.offset + p.length - 1}"}
                timeout = self.cfg.timeout_s
            else:
                url, hdr = f"{src}/v1/relay/{quote(run)}/{version}/pieces/{p.index}", headers
                timeout = self.cfg.relay_timeout_s
            buf = bytearray()
            try:
                async with asyncio.timeout(timeout):  # the whole piece, not each read: a trickling peer is slow
                    async with http.stream("GET", url, headers=hdr, timeout=timeout) as r:
                        if r.status_code not in (200, 206):
                            raise BadPiece(f"GET {url}: HTTP {r.status_code}")
                        async for chunk in r.aiter_raw():
                            buf += chunk
                            if len(buf) > p.length:  # never buffer more than the piece, whatever a peer sends
                                raise BadPiece(f"piece {p.index} from {src or 'the store'} is longer than "
                                               f"{p.length} bytes")
            except httpx.HTTPError as exc:
                raise TransferError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
            except TimeoutError:
                raise TransferError(f"GET {url}: no whole piece within {timeout:g} s") from None
            data = bytes(buf)
            got = xxhash.xxh3_128_hexdigest(data)
            if len(data) != p.length or got != p.xxh3_128:
                if src is None:  # the store's own bytes differ from its digests: as for a whole-file fetch
                    raise DigestMismatch(url, p.xxh3_128, got, "xxh3_128")
                raise BadPiece(f"piece {p.index} from {src} fails its digest")
            return data

        def put(p: Piece, data: bytes) -> None:
            fd = os.open(part / p.name, os.O_WRONLY)
            try:
                os.pwrite(fd, data, p.offset)
            finally:
                os.close(fd)

        async def worker(http: httpx.AsyncClient) -> None:
            for p in todo:
                store_tries = 0
                while True:
                    src = state["upstream"]
                    try:
                        data = await get(http, src, p)
                        await asyncio.to_thread(put, p, data)
                        h.mark(p.index)
                        self.stats["pieces_from_store" if src is None else "pieces_from_peers"] += 1
                        break
                    except (TransferError, WeightStoreError, BadPiece) as exc:
                        if src is None:
                            store_tries += 1
                            if store_tries > self.cfg.retries:
                                raise
                            await asyncio.sleep(min(0.2 * 2**store_tries, 5.0))
                            continue
                        async with lock:
                            if state["upstream"] == src:  # the first to see this upstream fail re-plans
                                state["failures"] += 1
                                self.stats["peer_failures"] += 1
                                log.warning("run %s version %d: upstream %s failed (%s)", run, version, src, exc)
                                if state["failures"] > self.cfg.relay_max_failures:
                                    state["upstream"] = None
                                else:
                                    state["upstream"] = await self._join(client, vpath, [src])

        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=2 * self.cfg.relay_window)) as http:
            tasks = [asyncio.create_task(worker(http)) for _ in range(self.cfg.relay_window)]
            try:
                await asyncio.gather(*tasks)
            except BaseException:  # one gave up (the store unreachable too long): stop the others with it
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
        return True

    async def _join(self, client, vpath: str, failed: list[str]) -> str | None:
        """The upstream the store assigns (None: the store itself); retried while the store is unreachable
        (a cut link), up to `timeout_s` x (retries + 1)."""
        loop = asyncio.get_running_loop()
        end, wait = loop.time() + self.cfg.timeout_s * (self.cfg.retries + 1), 0.2
        while True:
            try:
                res = await client._json("POST", vpath + "/relay", {"peer": self.url, "failed": failed})
                up = res.get("upstream")
                return up if isinstance(up, str) and up != self.url else None
            except OSError:  # TransferError, or a refused / unroutable connect (a cut link)
                if loop.time() > end:
                    raise
                await asyncio.sleep(wait)
                wait = min(wait * 2, 2.0)
