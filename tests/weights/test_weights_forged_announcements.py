"""The announcement carries the manifest's digest and readers check it; a
forged announcement (a version the store does not hold) is refused with a report, never acted on.
Real nats-server, real weight store (in-process uvicorn), real KV bucket."""

from __future__ import annotations

import asyncio
import hashlib
import json
from types import SimpleNamespace

import pytest
import xxhash
from weights_helpers import state_dict

from rollout_service.weight_sync import WeightFollower, weight_store_source
from shared.config import JetrlConfig
from shared.contract import codec
from shared.contract.messages import WeightVersion
from shared.contract.subjects import WEIGHTS_KV_BUCKET
from trainer_service.publish import StorePublisher
from weight_store.announce import latest
from weight_store.client import AnnouncementRefused, DigestMismatch, WeightStoreClient
from weight_store.manifest import manifest_sha256

FORGED = 1_000_000


def tamper(root, run: str, version: int) -> None:
    """What the tester did: flip a byte of a version's file and rewrite manifest.json to match (both digests)."""
    d = root / run / str(version)
    manifest = json.loads((d / "manifest.json").read_bytes())
    f = manifest["files"][0]
    p = d / f["name"]
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    f["sha256"] = hashlib.sha256(data).hexdigest()
    f["xxh3_128"] = xxhash.xxh3_128(bytes(data)).hexdigest()
    (d / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))


async def forge(js, run: str, version: int = FORGED) -> None:
    kv = await js.key_value(WEIGHTS_KV_BUCKET)
    await kv.put(run, codec.encode(WeightVersion(run=run, version=version, step=version, sha256="0" * 64)))


@pytest.mark.parametrize("digest", ["xxh3_128", "sha256"])
@pytest.mark.parametrize("shared_fs", [True, False])
async def test_a_rewritten_manifest_does_not_match_the_announced_digest(store, tmp_path, js, digest, shared_fs):
    srv = store(digest=digest)
    client = WeightStoreClient(srv.cfg.model_copy(update={"shared_fs": shared_fs}))
    wv = await client.publish_version(js, "flip", 0, state_dict(n=1), metadata={"instance": "t"})
    assert wv.sha256 == manifest_sha256(await client.manifest("flip", 0))
    tamper(tmp_path / "root", "flip", 0)
    # the files match the rewritten manifest, so a check against the manifest alone passes ...
    assert (await client.fetch("flip", 0)).is_dir()
    # ... but the manifest is not the one the trainer announced
    fresh = WeightStoreClient(srv.cfg.model_copy(update={"shared_fs": shared_fs, "cache_dir": str(tmp_path / "c2")}))
    with pytest.raises(AnnouncementRefused, match="manifest of version 0 has sha256"):
        await fresh.fetch("flip", 0, expect_sha256=wv.sha256)


async def test_files_are_still_checked_against_the_announced_manifest(store, tmp_path, js):
    srv = store()
    client = WeightStoreClient(srv.cfg.model_copy(update={"shared_fs": True}))
    wv = await client.publish_version(js, "f2", 0, state_dict(n=1), metadata={"instance": "t"})
    name = wv.files[0]["name"]
    p = tmp_path / "root" / "f2" / "0" / name
    data = bytearray(p.read_bytes())
    data[100] ^= 0xFF
    p.write_bytes(bytes(data))  # manifest untouched: the announced digest matches, the file does not
    with pytest.raises(DigestMismatch):
        await client.fetch("f2", 0, expect_sha256=wv.sha256)


class VersionedEngine:
    """The two things WeightFollower needs of an engine: its version and update_weights."""

    def __init__(self):
        self.version, self.loaded = 0, []

    async def update_weights(self, version: int, path: str | None = None, state_dict=None) -> None:
        self.loaded.append(version)
        self.version = version


async def until(cond, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("shared_fs", [True, False])
async def test_a_worker_refuses_forged_and_tampered_versions_and_keeps_serving(store, tmp_path, js, shared_fs):
    srv = store()
    cfg = srv.cfg.model_copy(update={"shared_fs": shared_fs})
    pub = WeightStoreClient(cfg)
    await pub.publish_version(js, "w", 0, state_dict(n=1, seed=0), metadata={"instance": "t"})
    await pub.publish_version(js, "w", 1, state_dict(n=1, seed=1), metadata={"instance": "t"})
    watch, fetch, latest_fn, close = weight_store_source(SimpleNamespace(run="w", weights=cfg), js)
    engine, refused = VersionedEngine(), []

    async def on_refused(version: int, why: str) -> None:
        refused.append((version, why))

    follower = WeightFollower(engine, "w", watch, fetch, latest_fn, retry_s=0.05, on_refused=on_refused)
    task = asyncio.create_task(follower.run())
    try:
        await until(lambda: engine.version == 1, what="version 1")
        # a forged announcement: refused at once (no retry every second), reported, lag back to 0
        await forge(js, "w")
        await until(lambda: refused, what="the refusal")
        assert refused[0][0] == FORGED and "does not hold version 1000000" in refused[0][1]
        await asyncio.sleep(1.0)
        assert len(refused) == 1 and engine.version == 1 and follower.lag == 0 and engine.loaded == [1]
        # a version released at the forged one does not hang the worker
        await asyncio.wait_for(follower.wait_for_version(FORGED), 5)
        # the trainer's next version overwrites the forgery and is loaded
        await pub.publish_version(js, "w", 2, state_dict(n=1, seed=2), metadata={"instance": "t"})
        await until(lambda: engine.version == 2, what="version 2")
        # a tampered store: files and manifest rewritten to match each other, not the announcement
        await pub.publish_version(js, "w", 3, state_dict(n=1, seed=3), metadata={"instance": "t"})
        await until(lambda: engine.version == 3, what="version 3")
        await pub.publish(  "w", 4, state_dict(n=1, seed=4), metadata={"instance": "t"})
        tamper(tmp_path / "root", "w", 4)
        kv = await js.key_value(WEIGHTS_KV_BUCKET)
        good = WeightVersion(run="w", version=4, step=4, sha256=(await latest(js, "w")).sha256)  # not v4's
        await kv.put("w", codec.encode(good))
        await until(lambda: len(refused) == 2, what="the second refusal")
        assert refused[1][0] == 4 and engine.version == 3 and follower.lag == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await close()


def trainer_config(srv, run: str) -> JetrlConfig:
    return JetrlConfig.model_validate({"run": run, "weights": srv.cfg.model_dump()})


async def test_the_trainer_publisher_ignores_and_overwrites_a_forged_announcement(store, js):
    srv = store()
    pub = StorePublisher(trainer_config(srv, "t1"), js)
    seen = []

    async def on_refused(wv, why):
        seen.append((wv.version, why))

    pub.on_refused = on_refused
    await pub.client.publish_version(js, "t1", 0, state_dict(n=1), metadata={"instance": "a"})
    await forge(js, "t1")
    # numbering comes from the store, not the forged KV value
    assert await pub.latest() is None and seen[-1][0] == FORGED
    assert await pub.newest_stored() == 0
    # publishing version 1 overwrites the forgery instead of a VersionConflict
    wv = await pub.client.publish_version(js, "t1", 1, state_dict(n=1, seed=1), metadata={"instance": "a"},
                                          on_forged=on_refused)
    assert (await latest(js, "t1")).version == 1 and wv.version == 1
    assert [v for v, _ in seen] == [FORGED, FORGED]
    assert (await pub.latest()).version == 1


async def test_the_eval_follower_ignores_a_forged_version_and_evaluates_real_ones(store, tmp_path, nc, js, monkeypatch):
    """`jetrl eval --follow` counts an announcement only once the store holds it as announced: a forged
    version 1000000 neither stalls it (loading a version that does not exist, forever) nor hides version 2."""
    from rollout_service.evaluation import follow
    from shared.config.eval import EvalConfig

    srv = store()
    pub = WeightStoreClient(srv.cfg)
    loaded: list[int] = []

    class Evaluator:
        async def load(self, version: int) -> None:
            loaded.append(version)

        async def evaluate(self, rows, dataset: str):
            return SimpleNamespace(version=loaded[-1], line=lambda: f"v{loaded[-1]}")

    class Session:  # EvalSession without engine or reward: the real NATS connection and weight-store client
        def __init__(self, cfg, ecfg):
            self.js, self.nc, self.weights, self.evaluator = js, nc, WeightStoreClient(srv.cfg), Evaluator()

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            await self.weights.close()

        async def emit(self, result, instance=""):
            pass

    monkeypatch.setattr(follow, "EvalSession", Session)
    data = tmp_path / "heldout.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n')
    cfg = JetrlConfig.model_validate({"run": "ev", "weights": srv.cfg.model_dump()})
    stop = asyncio.Event()
    task = asyncio.create_task(follow.eval_follow(cfg, EvalConfig(dataset=str(data), eval_every=1), stop))
    try:
        await pub.publish_version(js, "ev", 0, state_dict(n=1, seed=0), metadata={"instance": "t"})
        await until(lambda: loaded == [0], what="version 0 evaluated")
        await forge(js, "ev")
        await asyncio.sleep(1.0)
        await pub.publish_version(js, "ev", 1, state_dict(n=1, seed=1), metadata={"instance": "t"})
        await until(lambda: 1 in loaded, what="version 1 evaluated")
        assert FORGED not in loaded, loaded
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
