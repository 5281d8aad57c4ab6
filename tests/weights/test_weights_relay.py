"""Relay fan-out on loopback (weight_store/relay.py, weight_store/routes/relay.py): readers chained by the
store, each serving the pieces it has checked to the next. The namespace-host version (six hosts, a
relay SIGKILLed, a link cut) is tests/multihost/test_weight_relay.py."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
from weights_helpers import raw_request, state_dict

from weight_store.client import WeightStoreClient, load_state_dict
from weight_store.pieces import Piece, check_pieces, piece_digests


def _bytes_out(url: str) -> float:
    _, _, body = raw_request(url, target="/metrics")
    for line in body.decode().splitlines():
        if line.startswith("jetrl_weights_bytes_out_total "):
            return float(line.split()[1])
    raise AssertionError("no jetrl_weights_bytes_out_total")


def test_pieces_cover_each_file_in_order_with_their_digests(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 10_000)
    (tmp_path / "b").write_bytes(b"")
    manifest = {"run": "r", "version": 1, "files": [{"name": "a", "size": 10_000}, {"name": "b", "size": 0}]}
    import xxhash

    from weight_store.manifest import manifest_sha256

    doc = {"format": 1, "manifest_sha256": manifest_sha256(manifest), "piece_size": 4096,
           "files": {"a": piece_digests(tmp_path / "a", 4096), "b": piece_digests(tmp_path / "b", 4096)}}
    pieces = check_pieces(doc, manifest)
    assert [(p.name, p.offset, p.length) for p in pieces] == [("a", 0, 4096), ("a", 4096, 4096), ("a", 8192, 1808),
                                                              ("b", 0, 0)]
    assert pieces[2] == Piece(2, "a", 8192, 1808, xxhash.xxh3_128_hexdigest(b"x" * 1808))
    with pytest.raises(ValueError, match="another manifest"):
        check_pieces({**doc, "manifest_sha256": "0" * 64}, manifest)
    with pytest.raises(ValueError, match="expected 3"):
        check_pieces({**doc, "files": {**doc["files"], "a": doc["files"]["a"][:2]}}, manifest)
    with pytest.raises(ValueError, match="piece_size"):
        check_pieces({**doc, "piece_size": 1}, manifest)


def _relay_cfg(srv, tmp_path, i: int, **kw):
    return srv.cfg.model_copy(update={"fanout": "relay", "relay_host": "127.0.0.1", "relay_port": 0, "relay_min_mb": 0,
                                      "cache_dir": str(tmp_path / f"cache-{i}"), **kw})


async def test_readers_chain_through_relays_and_the_store_sends_about_one_copy(store, tmp_path):
    srv = store(piece_kb=1024)
    pub = WeightStoreClient(srv.cfg)
    sd = state_dict(n=16)  # ~4 MiB bf16 + extras: a few 1 MiB pieces
    wv = await pub.publish("r", 0, sd)
    size = sum(f["size"] for f in wv.files)
    before = _bytes_out(srv.url)
    readers = [WeightStoreClient(_relay_cfg(srv, tmp_path, i)) for i in range(5)]
    try:
        paths = await asyncio.gather(*(r.fetch("r", 0, expect_sha256=wv.sha256) for r in readers))
        for p in paths:
            got = load_state_dict(p)
            assert all(torch.equal(got[k], sd[k]) for k in sd)
        served = _bytes_out(srv.url) - before
        assert served < 2 * size, (served, size)
        from_peers = sum(r.relay.stats["pieces_from_peers"] for r in readers)
        assert from_peers >= 4 * len(readers[0].relay.held[("r", 0)].pieces) * 0.9
        assert all(r.stats["relay_fetches"] == 1 for r in readers)
    finally:
        for r in readers:
            await r.close()


class _Liar:
    """A relay that joins the chain and serves wrong bytes for every piece (a hostile or broken host)."""

    def __init__(self, size: int = 1024):
        self.served, self.size = 0, size

    async def start(self) -> str:
        async def handle(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            body = b"\0" * self.size
            self.served += 1
            if self.size < 0:  # a trickle: the right length announced, a byte every 0.2 s (each read is quick)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\nConnection: close\r\n\r\n")
                try:
                    for _ in range(1 << 20):
                        writer.write(b"\0")
                        await writer.drain()
                        await asyncio.sleep(0.2)
                except (ConnectionError, OSError):
                    return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize("size", [1024, 64 << 20, -1], ids=["short", "endless", "trickle"])
async def test_a_relay_serving_bad_pieces_is_reported_and_the_reader_still_gets_exact_bytes(store, tmp_path, size):
    srv = store(piece_kb=1024)
    pub = WeightStoreClient(srv.cfg)
    sd = state_dict(n=8)
    wv = await pub.publish("r", 0, sd)
    liar = _Liar(size)  # a short piece, or far more bytes than a piece (never buffered past the piece)
    url = await liar.start()
    # the liar joins first: the honest reader is chained behind it
    status, _, body = raw_request(srv.url, "POST", "/v1/runs/r/versions/0/relay",
                                  {"Content-Type": "application/json"}, json.dumps({"peer": url}).encode())
    assert status == 200 and json.loads(body)["upstream"] is None
    reader = WeightStoreClient(_relay_cfg(srv, tmp_path, 0, relay_timeout_s=1.0))
    try:
        got = load_state_dict(await reader.fetch("r", 0, expect_sha256=wv.sha256))
        assert all(torch.equal(got[k], sd[k]) for k in sd)
        assert liar.served >= 1 and reader.relay.stats["peer_failures"] >= 1
        assert reader.relay.stats["pieces_from_store"] >= 1
        # the liar left the chain: the next joiner is chained behind the honest reader
        _, _, body = raw_request(srv.url, "POST", "/v1/runs/r/versions/0/relay",
                                 {"Content-Type": "application/json"}, json.dumps({"peer": "http://10.0.0.9:1"}).encode())
        assert json.loads(body)["upstream"] == reader.relay.url
    finally:
        liar.server.close()
        await reader.close()


async def test_a_relay_that_dies_is_skipped(store, tmp_path):
    srv = store(piece_kb=1024)
    pub = WeightStoreClient(srv.cfg)
    sd = state_dict(n=8)
    wv = await pub.publish("r", 0, sd)
    # a peer that joined and is gone (nothing listens on its port)
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()
    raw_request(srv.url, "POST", "/v1/runs/r/versions/0/relay", {"Content-Type": "application/json"},
                json.dumps({"peer": dead}).encode())
    reader = WeightStoreClient(_relay_cfg(srv, tmp_path, 0))
    try:
        got = load_state_dict(await reader.fetch("r", 0, expect_sha256=wv.sha256))
        assert all(torch.equal(got[k], sd[k]) for k in sd)
        assert reader.relay.stats["peer_failures"] == 1
    finally:
        await reader.close()


def test_the_relay_route_refuses_bad_peers_and_unknown_versions(store):
    srv = store()
    for body, code in [({"peer": "ftp://x"}, "bad_peer"), ({"peer": "http://a:1", "failed": "x"}, "bad_peer"),
                       ({}, "bad_peer")]:
        status, _, raw = raw_request(srv.url, "POST", "/v1/runs/r/versions/0/relay",
                                     {"Content-Type": "application/json"}, json.dumps(body).encode())
        assert status in (400, 404) and json.loads(raw)["error"] in (code, "not_found"), raw
    status, _, raw = raw_request(srv.url, "POST", "/v1/runs/r/versions/7/relay",
                                 {"Content-Type": "application/json"}, json.dumps({"peer": "http://a:1"}).encode())
    assert status == 404


async def test_a_relay_serves_only_with_the_stores_tokens(store, tmp_path):
    srv = store(piece_kb=1024, token="write-tok", read_token="read-tok")
    pub = WeightStoreClient(srv.cfg)
    sd = state_dict(n=4)
    wv = await pub.publish("r", 0, sd)
    reader = WeightStoreClient(_relay_cfg(srv, tmp_path, 0, token="", read_token="read-tok"))
    try:
        await reader.fetch("r", 0, expect_sha256=wv.sha256)
        url = reader.relay.url
        for headers, status in [({}, 401), ({"Authorization": "Bearer nope"}, 403),
                                ({"Authorization": "Bearer read-tok"}, 200),
                                # a relay knows only the tokens of its own config (this worker holds the read one)
                                ({"Authorization": "Bearer write-tok"}, 403)]:
            async with httpx.AsyncClient() as http:
                got = (await http.get(f"{url}/v1/relay/r/0/pieces/0", headers=headers, timeout=10)).status_code
            assert got == status, (headers, got)
    finally:
        await reader.close()
