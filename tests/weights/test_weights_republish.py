"""The trainer's publisher (trainer_service/publish.py StorePublisher, i.e.
weight_store.client.WeightStoreClient.publish_version) against a live weight store and a real nats-server, when a publish is retried (the trainer retries while the store or NATS restarts):
a retry whose first attempt already committed or announced finishes instead of failing, and a version
committed but never announced by a trainer that died in between is reported as taken. The `directory`
publisher takes the same path (weight_store.client.publish_and_announce) and writes the store's manifest."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats.errors
import pytest
import torch
from transformers import PretrainedConfig

from shared.config import JetrlConfig
from trainer_service.publish import DirectoryPublisher, StorePublisher, retryable_publish_error, stage_version
from weight_store.announce import VersionConflict, latest
from weight_store.client import VersionTakenError
from weight_store.manifest import MANIFEST_FORMAT, new_manifest
from weight_store.transfer import TransferError, WeightStoreError

RUN = "rp"


def publisher(store_cfg, js) -> StorePublisher:
    return StorePublisher(JetrlConfig(run=RUN, weights=store_cfg), js)


async def publish(pub: StorePublisher | DirectoryPublisher, version: int, instance: str, value: float = 0.0):
    sd = {"w": torch.full((4,), value)}
    return await pub.publish(version, version, sd, PretrainedConfig(), None, metadata={"instance": instance})


async def test_a_retried_publish_finishes_and_a_dead_trainers_unannounced_version_is_taken(store, js, tmp_path):
    srv = store()
    pub = publisher(srv.cfg, js)
    first = await publish(pub, 1, "trainer-b")
    # the same publish again (its replies were lost): the commit and the announcement are already there
    again = await publish(pub, 1, "trainer-b")
    assert (again.version, again.sha256, again.manifest_url) == (first.version, first.sha256, first.manifest_url)
    assert (await latest(js, RUN)).sha256 == first.sha256

    # a trainer that died between commit and announcement left version 2 in the store
    d = tmp_path / "orphan"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"not really")
    await pub.client.publish(RUN, 2, d, step=2, metadata={"instance": "trainer-a"})
    with pytest.raises(VersionTakenError, match="never announced"):
        await publish(pub, 2, "trainer-b", value=1.0)
    assert (await publish(pub, 3, "trainer-b", value=1.0)).version == 3
    with pytest.raises(VersionConflict):  # an older version than the announced one is still refused
        await publish(pub, 1, "trainer-c")


async def test_the_directory_publisher_writes_the_stores_manifest_and_retries_the_same_way(js, tmp_path):
    cfg = JetrlConfig.model_validate({"run": RUN, "trainer": {"publisher": "directory",
                                                              "publish_dir": str(tmp_path / "pub")}})
    pub = DirectoryPublisher(cfg, js)
    first = await publish(pub, 1, "trainer-b")
    m = json.loads(Path(first.manifest_url.removeprefix("file://")).read_bytes())
    assert set(m) == set(new_manifest(RUN, 1, 1, [])) and m["format"] == MANIFEST_FORMAT
    assert m["created_at"] == first.created_at and m["metadata"] == {"instance": "trainer-b"}
    assert await pub.check.refusal(first) is None  # verifies against the dir (weight_store.verify)
    again = await publish(pub, 1, "trainer-b")  # a retry: the version is there and announced
    assert (again.version, again.sha256, again.manifest_url) == (first.version, first.sha256, first.manifest_url)
    assert (await latest(js, RUN)).sha256 == first.sha256

    staged = stage_version(cfg, {"w": torch.zeros(4)}, PretrainedConfig(), None, pub.staging_root)
    await asyncio.to_thread(pub.dir.commit, RUN, 2, 2, staged, {"instance": "trainer-a"})  # never announced
    staged.discard()
    with pytest.raises(VersionTakenError, match="never announced"):
        await publish(pub, 2, "trainer-b", value=1.0)
    assert (await publish(pub, 3, "trainer-b", value=1.0)).version == 3
    with pytest.raises(VersionConflict):
        await publish(pub, 1, "trainer-c")


def test_only_outages_are_retried():
    assert retryable_publish_error(ConnectionRefusedError(111, "refused"))
    assert retryable_publish_error(TransferError("connection cut"))
    assert retryable_publish_error(TimeoutError("timed out"))
    assert retryable_publish_error(WeightStoreError(503, "unavailable", "starting"))
    assert retryable_publish_error(nats.errors.TimeoutError())
    assert retryable_publish_error(nats.errors.ConnectionClosedError())
    assert not retryable_publish_error(WeightStoreError(409, "too_many_versions", "full"))
    assert not retryable_publish_error(WeightStoreError(400, "bad_commit", "no files"))
    assert not retryable_publish_error(VersionConflict(RUN, 2, 3))
    assert not retryable_publish_error(VersionTakenError("v2 in the store"))
    assert not retryable_publish_error(ValueError("a bug"))
