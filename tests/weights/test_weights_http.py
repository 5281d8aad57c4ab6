"""Upload / commit / download over real HTTP on loopback: round trips, Range, resume, sha256."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from weights_helpers import CuttingProxy, raw_request, state_dict

from weight_store import transfer
from weight_store.client import DigestMismatch, WeightStoreClient, load_state_dict


async def test_multi_shard_state_dict_round_trips_over_http(store):
    srv = store(shard_size_mb=1, chunk_mb=1)
    client = WeightStoreClient(srv.cfg)
    sd = state_dict(n=6)  # 6 x 256 KiB bf16 + extras -> 2 shards of <= 1 MiB
    wv = await client.publish("demo", 0, sd, step=5, metadata={"note": "init"})
    names = [f["name"] for f in wv.files]
    assert names == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                     "model.safetensors.index.json"]
    assert wv.run == "demo" and wv.version == 0 and wv.step == 5
    manifest = await client.manifest("demo", 0)
    assert manifest["files"] == wv.files and manifest["metadata"] == {"note": "init"}
    assert manifest["dtype"] == "mixed" and manifest["step"] == 5
    assert hashlib.sha256(json.dumps(manifest, indent=1, sort_keys=True).encode()).hexdigest() == wv.sha256

    path = await client.fetch("demo", 0)
    assert path.is_relative_to(srv.cfg.cache_dir)  # shared_fs off: a real download
    got = load_state_dict(path)
    assert got.keys() == sd.keys()
    for k in sd:
        assert torch.equal(got[k], sd[k]), k
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(sd)
    assert await client.versions("demo") == [0] and (await client.latest("demo"))["version"] == 0
    assert await client.runs() == ["demo"]


async def test_fetched_dir_loads_with_transformers_from_pretrained(store, tmp_path):
    from transformers import AutoModelForCausalLM

    from shared.config import ModelConfig
    from shared.model.tinymodel import build_tiny_model, load_tokenizer, save_tiny

    srv = store(shard_size_mb=1)
    client = WeightStoreClient(srv.cfg)
    src = save_tiny(ModelConfig(), tmp_path / "tiny")
    model, _ = build_tiny_model(ModelConfig())
    # a state dict in several shards + the model's config file, as the trainer publishes
    wv = await client.publish("demo", 1, model.state_dict(), files={"config.json": src / "config.json"})
    assert len([f for f in wv.files if f["name"].endswith(".safetensors")]) >= 1
    loaded = AutoModelForCausalLM.from_pretrained(await client.fetch("demo", 1))
    for k, v in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v, rtol=0, atol=0)
    # a whole dir (config + weights + tokenizer files) publishes as it is
    await client.publish("demo", 2, src)
    fetched = await client.fetch("demo", 2)
    def files(d):
        return sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())

    assert "tokenizer/tokenizer.json" in files(src)  # the tiny model keeps its tokenizer in a subdir
    assert files(fetched) == sorted([*files(src), "manifest.json"])
    AutoModelForCausalLM.from_pretrained(fetched)
    assert load_tokenizer(fetched).encode("max 3 8") == load_tokenizer(src).encode("max 3 8")


@pytest.mark.parametrize("http", [None, "h11"], ids=["sendfile", "chunked"])
async def test_range_download_returns_the_asked_bytes_with_etag(store, http):
    srv = store(http=http)
    client = WeightStoreClient(srv.cfg)
    data = bytes(range(256)) * 1000
    wv = await client.publish("r", 0, {"x": torch.frombuffer(bytearray(data), dtype=torch.uint8)})
    f = wv.files[0]
    target = f"/v1/runs/r/versions/0/files/{f['name']}"
    body = (await client.fetch("r", 0) / f["name"]).read_bytes()
    status, h, full = raw_request(srv.url, target=target)
    assert status == 200 and full == body and h["etag"] == f'"{f["sha256"]}"' and h["accept-ranges"] == "bytes"
    status, h, part = raw_request(srv.url, target=target, headers={"Range": "bytes=100-199"})
    assert status == 206 and part == body[100:200] and h["content-range"] == f"bytes 100-199/{len(body)}"
    status, h, part = raw_request(srv.url, target=target, headers={"Range": "bytes=-10"})
    assert status == 206 and part == body[-10:]
    status, h, part = raw_request(srv.url, target=target, headers={"Range": f"bytes={len(body)}-"})
    assert status == 416 and h["content-range"] == f"bytes */{len(body)}"
    # If-Range with a stale ETag: the whole file instead of the range
    status, _, part = raw_request(srv.url, target=target, headers={"Range": "bytes=0-9", "If-Range": '"stale"'})
    assert status == 200 and part == body
    status, h, part = raw_request(srv.url, "HEAD", target)
    assert status == 200 and part == b"" and h["content-length"] == str(len(body))
    zero_copy = srv.app.state.store.metrics.sendfile_out._value.get()
    assert (zero_copy > 0) if http is None else (zero_copy == 0)  # which path served the bytes


@pytest.mark.parametrize("http", [None, "h11"], ids=["sendfile", "chunked"])
async def test_download_resumes_with_range_after_a_cut_connection(store, tmp_path, http):
    srv = store(chunk_mb=1, http=http)
    client = WeightStoreClient(srv.cfg)
    wv = await client.publish("cut", 0, state_dict(n=8, rows=512, cols=512))  # ~4 MiB
    f = wv.files[0]
    proxy = CuttingProxy(srv.cfg.port, cut_after=1_500_000)
    try:
        url = transfer.file_url(f"http://127.0.0.1:{proxy.port}", "cut", 0, f["name"])
        dest = tmp_path / "dl.safetensors"
        transfer.get_file(url, dest, f["size"], f["sha256"], headers={}, chunk=1 << 20, timeout=30, retries=3,
                          check=("xxh3_128", f["xxh3_128"]))  # the digest of the resumed file stays in step
    finally:
        proxy.close()
    assert proxy.connections == 2
    assert "range:" not in proxy.heads[0].lower()
    resumed_at = int(proxy.heads[1].lower().split("range: bytes=")[1].split("-")[0])
    assert 0 < resumed_at < f["size"]  # the second request asked only for the missing tail
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == f["sha256"]


async def test_the_store_records_both_digests_of_the_received_bytes(store, tmp_path):
    import xxhash

    from weight_store.manifest import file_digest, hash_file

    srv = store()
    wv = await WeightStoreClient(srv.cfg).publish("both", 0, state_dict(n=2))
    f = wv.files[0]
    stored = tmp_path / "root" / "both" / "0" / f["name"]
    assert f["sha256"] == hashlib.sha256(stored.read_bytes()).hexdigest() == hash_file(stored, "sha256")
    assert f["xxh3_128"] == xxhash.xxh3_128(stored.read_bytes()).hexdigest() == hash_file(stored, "xxh3_128", 4096)
    assert file_digest(f, "xxh3_128") == ("xxh3_128", f["xxh3_128"])
    assert file_digest({"sha256": "ab"}, "xxh3_128") == ("sha256", "ab")  # a manifest of an older store


@pytest.mark.parametrize("digest", ["xxh3_128", "sha256"])
async def test_a_flipped_byte_on_the_store_is_caught_by_the_digest(store, tmp_path, digest):
    srv = store()
    cfg = srv.cfg.model_copy(update={"digest": digest})
    client = WeightStoreClient(cfg)
    wv = await client.publish("flip", 0, state_dict(n=2))
    stored = tmp_path / "root" / "flip" / "0" / wv.files[0]["name"]
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size, one bit differs
    stored.write_bytes(bytes(data))
    with pytest.raises(DigestMismatch, match=f"{digest} of the downloaded bytes"):
        await client.fetch("flip", 0)
    assert not (cfg.cache_dir and (tmp_path / cfg.cache_dir / "flip" / "0").exists())
    # in place on the shared filesystem: caught by default (it used to be served silently)
    shared = WeightStoreClient(cfg.model_copy(update={"shared_fs": True}))
    with pytest.raises(DigestMismatch):
        await shared.fetch("flip", 0)
    trusting = WeightStoreClient(cfg.model_copy(update={"shared_fs": True, "verify_shared_sha256": False}))
    assert await trusting.fetch("flip", 0) == stored.parent  # the explicit opt-out: zero reads, zero copies


async def test_metrics_count_bytes_versions_and_commit_latency(store):
    srv = store()
    client = WeightStoreClient(srv.cfg)
    await client.publish("m", 0, state_dict(n=2))
    await client.fetch("m", 0)
    status, _, body = raw_request(srv.url, target="/metrics")
    text = body.decode()
    assert status == 200

    def value(name: str) -> float:
        line = next(line for line in text.splitlines() if line.startswith(name))
        return float(line.rsplit(" ", 1)[1])

    assert value("jetrl_weights_bytes_in_total") > 500_000
    assert value("jetrl_weights_bytes_out_total") > 500_000
    assert value('jetrl_weights_versions{run="m"}') == 1
    assert value("jetrl_weights_commit_seconds_count") == 1
