"""Delta versions (weight_store/delta.py): a version sent as its changed bits against the previous one.

By hand on small files (xor, copy, zstd, a blob that inflates past its size), then over real HTTP: 20
consecutive versions of a model trained with AdamW (fp32 and bf16) rebuilt bit-exactly from deltas; a
worker that missed versions or joins late gets the full version; a tampered delta is refused and the
version fetched whole; a LoRA version gets no delta."""

from __future__ import annotations

import json

import pytest
import torch
import zstandard
from weights_helpers import state_dict

from weight_store import delta as dl
from weight_store.client import WeightStoreClient, load_state_dict
from weight_store.manifest import MANIFEST, file_digests, new_manifest


def _version(d, version: int, files: dict[str, bytes]) -> dict:
    d.mkdir(parents=True)
    entries = []
    for name, data in files.items():
        (d / name).write_bytes(data)
        entries.append({"name": name, "size": len(data), **file_digests(d / name)})
    m = new_manifest("r", version, version, entries, dtype="bfloat16")
    (d / MANIFEST).write_text(json.dumps(m))
    return m


def test_a_delta_holds_only_the_changed_bits_and_rebuilds_every_file_bit_exactly(tmp_path):
    base = _version(tmp_path / "0", 0, {"w.bin": bytes([1, 2, 3, 4]) * 4096, "config.json": b"{}",
                                        "old.bin": b"abc"})
    new_w = bytearray(bytes([1, 2, 3, 4]) * 4096)
    new_w[2] = 7  # one byte changed: 3 -> 7, so the xor is 3 ^ 7 = 4 there and 0 everywhere else
    new = _version(tmp_path / "1", 1, {"w.bin": bytes(new_w), "config.json": b"{}", "old.bin": b"abcd"})
    doc = dl.build_delta(tmp_path / "1", new, tmp_path / "0", base, max_ratio=1.0)
    modes = {e["name"]: e["mode"] for e in doc["files"]}
    assert modes == {"w.bin": "xor", "config.json": "copy", "old.bin": "zstd"}
    assert doc["base"] == 0 and doc["version"] == 1 and doc["full_bytes"] == 16384 + 2 + 4
    xor = zstandard.ZstdDecompressor().decompress((tmp_path / "1" / ".delta" / "w.bin.zst").read_bytes())
    want = bytearray(16384)
    want[2] = 4
    assert xor == bytes(want)
    assert doc["delta_bytes"] < 100  # 16 KiB with one changed byte
    assert dl.check_delta(json.loads((tmp_path / "1" / ".delta" / "delta.json").read_text()), new, base) == doc
    for e in doc["files"]:
        blob = tmp_path / "1" / ".delta" / dl.blob_name(e["name"]) if e["mode"] != "copy" else None
        dl.apply_file(e, blob, tmp_path / "0" / e["name"], tmp_path / "out" / e["name"])
        assert (tmp_path / "out" / e["name"]).read_bytes() == (tmp_path / "1" / e["name"]).read_bytes()


def test_a_delta_is_not_written_when_it_would_not_be_smaller_or_for_an_adapter(tmp_path):
    import os

    base = _version(tmp_path / "0", 0, {"w.bin": os.urandom(1 << 16)})
    new = _version(tmp_path / "1", 1, {"w.bin": os.urandom(1 << 16)})  # every bit random: no gain
    assert dl.build_delta(tmp_path / "1", new, tmp_path / "0", base, max_ratio=0.5) is None
    assert sorted(p.name for p in (tmp_path / "1").iterdir()) == [MANIFEST, "w.bin"]  # nothing left behind
    lora = dict(new, kind="lora")
    assert dl.build_delta(tmp_path / "1", lora, tmp_path / "0", base, max_ratio=1.0) is None


def test_a_blob_that_inflates_past_its_file_or_falls_short_is_refused(tmp_path):
    (tmp_path / "base").write_bytes(bytes(100))
    bomb = tmp_path / "bomb.zst"
    bomb.write_bytes(zstandard.ZstdCompressor().compress(bytes(10_000_000)))
    with pytest.raises(dl.DeltaRefused, match="more"):
        dl.apply_file({"name": "w", "mode": "xor", "target_size": 100}, bomb, tmp_path / "base", tmp_path / "o")
    short = tmp_path / "short.zst"
    short.write_bytes(zstandard.ZstdCompressor().compress(bytes(50)))
    with pytest.raises(dl.DeltaRefused, match="50 bytes"):
        dl.apply_file({"name": "w", "mode": "zstd", "target_size": 100}, short, None, tmp_path / "o")
    junk = tmp_path / "junk.zst"
    junk.write_bytes(b"not zstd at all")
    with pytest.raises(dl.DeltaRefused, match="decompress"):
        dl.apply_file({"name": "w", "mode": "zstd", "target_size": 100}, junk, None, tmp_path / "o")


def test_check_delta_refuses_a_document_for_another_version_base_or_file_list(tmp_path):
    base = _version(tmp_path / "0", 0, {"w.bin": bytes(4096)})
    new = _version(tmp_path / "1", 1, {"w.bin": bytes(4095) + b"\1"})
    other = _version(tmp_path / "2", 2, {"w.bin": bytes(4094) + b"\1\1"})
    doc = dl.build_delta(tmp_path / "1", new, tmp_path / "0", base, max_ratio=1.0)
    with pytest.raises(dl.DeltaRefused, match="another manifest"):
        dl.check_delta(doc, other, base)
    with pytest.raises(dl.DeltaRefused, match="another base"):
        dl.check_delta(doc, new, other)
    with pytest.raises(dl.DeltaRefused, match="not the version's files"):
        dl.check_delta({**doc, "files": doc["files"] + doc["files"]}, new, base)
    with pytest.raises(dl.DeltaRefused, match="unknown mode"):
        dl.check_delta({**doc, "files": [{**doc["files"][0], "mode": "exec"}]}, new, base)
    with pytest.raises(dl.DeltaRefused, match="target size"):
        dl.check_delta({**doc, "files": [{**doc["files"][0], "target_size": 1}]}, new, base)


def _trained_versions(dtype: torch.dtype, n: int = 20, lr: float = 1e-4):
    """n state dicts of a small model after successive AdamW steps, in `dtype` (as a trainer publishes)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    out = []
    for _ in range(n):
        out.append({k: v.detach().to(dtype).clone() for k, v in model.state_dict().items()})
        x = torch.randn(32, 256)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
async def test_twenty_trainer_versions_rebuild_bit_exactly_from_deltas(store, dtype):
    srv = store(delta_max_ratio=1.0)  # fp32 Adam steps change nearly every value: force the deltas
    pub, reader = WeightStoreClient(srv.cfg), WeightStoreClient(srv.cfg)
    versions = _trained_versions(dtype)
    for v, sd in enumerate(versions):
        await pub.publish("r", v, sd, step=v, files={"config.json": b'{"model_type": "x"}'})
        got = load_state_dict(await reader.fetch("r", v))
        assert got.keys() == sd.keys()
        for k in sd:
            assert torch.equal(got[k], sd[k]) and got[k].dtype == dtype, (v, k)
    assert reader.stats["full_fetches"] == 1 and reader.stats["delta_fetches"] == 19
    assert reader.stats["delta_refused"] == 0
    full = sum(f["size"] for f in (await reader.manifest("r", 19))["files"])
    assert reader.stats["delta_bytes"] < 19 * full
    if dtype == torch.bfloat16:  # most bf16 values do not move in one step at lr 1e-4
        assert reader.stats["delta_bytes"] < 0.5 * 19 * full


async def test_a_worker_that_missed_versions_or_joins_late_fetches_the_full_version(store):
    srv = store(keep_last=10)
    # the reader's full fetches go through the relay chain (weights.fanout=relay, the default)
    relay = {"fanout": "relay", "relay_host": "127.0.0.1", "relay_min_mb": 0}
    pub, reader = WeightStoreClient(srv.cfg), WeightStoreClient(srv.cfg.model_copy(update=relay))
    versions = _trained_versions(torch.bfloat16, n=6)
    for v, sd in enumerate(versions):
        await pub.publish("r", v, sd, step=v)
    await reader.fetch("r", 0)
    await reader.fetch("r", 1)
    assert (reader.stats["full_fetches"], reader.stats["delta_fetches"]) == (1, 1)
    path = await reader.fetch("r", 5)  # missed 2..4: the delta of 5 is against 4, which it lacks
    assert (reader.stats["full_fetches"], reader.stats["delta_fetches"]) == (2, 1)
    assert torch.equal(load_state_dict(path)["0.weight"], versions[5]["0.weight"])
    assert reader.stats["relay_fetches"] == 2
    late = WeightStoreClient(srv.cfg.model_copy(update={"cache_dir": srv.cfg.cache_dir + "-late", **relay}))
    await late.fetch("r", 5)
    assert (late.stats["full_fetches"], late.stats["delta_fetches"]) == (1, 0)
    assert late.relay.stats["pieces_from_peers"] > 0  # chained behind the first reader, which still holds 5
    await reader.close()
    await late.close()


def _forge(doc_path, blob_path, data: bytes) -> None:
    """Replace a blob and make the delta document agree with it (a tampered store)."""
    blob_path.write_bytes(data)
    doc = json.loads(doc_path.read_text())
    for e in doc["files"]:
        if e["mode"] == "xor":
            e.update(size=len(data), **file_digests(blob_path))
    doc_path.write_text(json.dumps(doc))


@pytest.mark.parametrize("how", ["coherent", "digest", "document"])
async def test_a_tampered_delta_is_refused_and_the_version_fetched_whole(store, how):
    srv = store()
    pub, reader = WeightStoreClient(srv.cfg), WeightStoreClient(srv.cfg)
    versions = _trained_versions(torch.bfloat16, n=2)
    wv0 = await pub.publish("r", 0, versions[0])
    wv1 = await pub.publish("r", 1, versions[1])
    await reader.fetch("r", 0, expect_sha256=wv0.sha256)
    vdir = srv.cfg.root + "/r/1/.delta/"
    from pathlib import Path

    doc_path, blob = Path(vdir) / "delta.json", Path(vdir) / "model.safetensors.zst"
    raw = zstandard.ZstdDecompressor().decompress(blob.read_bytes())
    flipped = bytearray(raw)
    flipped[len(flipped) // 2] ^= 0x40  # one weight's bit flipped
    if how == "coherent":  # blob and its digests replaced: only the rebuilt file's digest can tell
        _forge(doc_path, blob, zstandard.ZstdCompressor().compress(bytes(flipped)))
    elif how == "digest":  # blob replaced, document untouched
        blob.write_bytes(zstandard.ZstdCompressor().compress(bytes(flipped)))
    else:  # the document claims another base
        doc = json.loads(doc_path.read_text())
        doc["base_manifest_sha256"] = "0" * 64
        doc_path.write_text(json.dumps(doc))
    path = await reader.fetch("r", 1, expect_sha256=wv1.sha256)
    assert reader.stats["delta_refused"] == 1 and reader.stats["full_fetches"] == 2
    got = load_state_dict(path)
    assert all(torch.equal(got[k], versions[1][k]) for k in versions[1])
    assert not (path / ".delta").exists()


async def test_with_deltas_off_the_store_writes_none_and_clients_fetch_whole(store):
    srv = store(delta=False)
    pub, reader = WeightStoreClient(srv.cfg), WeightStoreClient(srv.cfg.model_copy(update={"delta": True}))
    for v, sd in enumerate([state_dict(seed=0), state_dict(seed=0)]):
        await pub.publish("r", v, sd)
        await reader.fetch("r", v)
    from pathlib import Path

    assert not (Path(srv.cfg.root) / "r" / "1" / ".delta").exists()
    assert (reader.stats["full_fetches"], reader.stats["delta_fetches"]) == (2, 0)


def test_publish_dtype_bfloat16_writes_bf16_floats_and_leaves_other_tensors(tmp_path):
    from safetensors.torch import load_file

    from shared.config import JetrlConfig, load_config
    from shared.model.tinymodel import build_tiny_model
    from trainer_service.publish import write_version_dir

    cfg = load_config(JetrlConfig, None, ["trainer.publish_dtype=bfloat16"], env={})
    model, tok = build_tiny_model(cfg.model)
    sd = {**model.state_dict(), "counter": torch.tensor([3], dtype=torch.int64)}
    write_version_dir(tmp_path / "v", cfg, sd, model.config, tok)
    got = load_file(tmp_path / "v" / "model.safetensors")
    assert got["counter"].dtype == torch.int64 and got["counter"].item() == 3
    floats = [k for k in sd if sd[k].is_floating_point()]
    assert floats and all(got[k].dtype == torch.bfloat16 for k in floats)
    assert all(torch.equal(got[k], sd[k].to(torch.bfloat16)) for k in floats)
    as_trained = load_config(JetrlConfig, env={})
    write_version_dir(tmp_path / "w", as_trained, sd, model.config, tok)
    assert load_file(tmp_path / "w" / "model.safetensors")[floats[0]].dtype == sd[floats[0]].dtype
