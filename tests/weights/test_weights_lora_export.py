"""LoRA versions out of the store: `jetrl weights export --merge` writes a merged HF model dir equal to the
trainer's policy, without --merge the adapter dir; the evaluator loads adapter versions and refuses one on
another base. The commit refuses a malformed `adapter` object."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from weights_helpers import REPO, ThreadServer, raw_request, store_config

from rollout_service.engines.local import LocalEngine
from rollout_service.evaluation.evaluator import Evaluator
from shared.config import JetrlConfig, dump_config, load_config
from shared.model.adapters import BaseMismatch
from tests.trainer.fsdp_step_worker import fixed_items
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.packing import pack
from trainer_service.publish import write_version_dir
from trainer_service.step import train_step
from weight_store.client import WeightStoreClient, WeightStoreError

RUN = "lx"


@pytest.fixture
async def published(tmp_path):
    """A weight store holding version 1 of RUN: a LoRA adapter after two trainer steps (and the trainer)."""
    srv = ThreadServer(store_config(tmp_path / "root")).start()
    cfg = load_config(JetrlConfig, None, [f"run={RUN}", "trainer.lora.rank=4", "trainer.lora.alpha=8",
                                          "trainer.lora.modules_to_save=[lm_head]", "trainer.optim.lr=0.05",
                                          "trainer.device=cpu", "trainer.micro_batch_tokens=64"])
    cfg.weights = srv.cfg
    trainer = FSDPBackend(cfg)
    for _ in range(2):
        train_step(trainer, fixed_items(), cfg.trainer)
    d = tmp_path / "v1"
    adapter = write_version_dir(d, cfg, trainer.full_state_dict(), None, None)
    await WeightStoreClient(srv.cfg).publish(RUN, 1, d, step=2, adapter=adapter)
    yield cfg, trainer
    trainer.close()
    srv.stop()


def _policy_logprobs(trainer, tokens: list[int]) -> torch.Tensor:
    import numpy as np

    from trainer_service.packing import TrainItem

    item = TrainItem(tokens=np.array(tokens, np.int32), loss_mask=np.ones(len(tokens), np.uint8),
                     behav_logp=np.zeros(len(tokens), np.float32), advantage=0.0, group_id="g")
    return trainer.forward(pack([item]), "policy")[0]


async def test_export_merge_writes_a_hf_model_equal_to_the_trainers_policy(published, tmp_path):
    cfg, trainer = published
    conf = tmp_path / "run.yaml"
    conf.write_text(dump_config(cfg, redact=False))
    merged, adapter = tmp_path / "merged", tmp_path / "adapter"
    for out, extra in ((merged, ["--merge"]), (adapter, [])):
        r = subprocess.run([sys.executable, "-m", "launcher.cli", "weights", "export", "1", "--out", str(out),
                            *extra, "-c", str(conf)], capture_output=True, text=True, timeout=120, cwd=REPO)
        assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32).eval()
    tokens = [5, 9, 14, 22, 7, 30, 31, 8]
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), -1)
    ours = lp[:-1].gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]
    theirs = _policy_logprobs(trainer, tokens)[:-1]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    assert (merged / "tokenizer").is_dir()
    # refusing to overwrite
    r = subprocess.run([sys.executable, "-m", "launcher.cli", "weights", "export", "1", "--out", str(merged),
                        "--merge", "-c", str(conf)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 1 and "not empty" in r.stderr


async def test_the_evaluator_loads_adapter_versions_and_refuses_another_base(published):
    cfg, trainer = published
    client = WeightStoreClient(cfg.weights)
    engine = LocalEngine(cfg)
    await engine.start()
    try:
        ev = Evaluator(cfg, cfg.eval, engine, engine.tokenizer, reward=None, weights=client)
        await ev.load(1)
        assert engine.version == 1
        tokens = [5, 9, 14, 22, 7, 30]
        with torch.no_grad():
            lp = torch.log_softmax(engine.model(torch.tensor([tokens])).logits[0].float(), -1)
        ours = lp[:-1].gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]
        torch.testing.assert_close(ours, _policy_logprobs(trainer, tokens)[:-1], atol=1e-4, rtol=0)
    finally:
        await engine.close()
    other = cfg.model_copy(deep=True)
    other.model.seed = 5
    engine = LocalEngine(other)
    await engine.start()
    try:
        ev = Evaluator(other, other.eval, engine, engine.tokenizer, reward=None, weights=client)
        with pytest.raises(BaseMismatch, match="seed=5"):
            await ev.load(1)
        assert engine.version == 0
    finally:
        await engine.close()


async def test_a_commit_with_a_malformed_adapter_is_refused_naming_the_field(store, tmp_path):
    srv = store()
    client = WeightStoreClient(srv.cfg)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "adapter_model.safetensors").write_bytes(b"x")
    good = {"base_model": "m", "base_sha256": "a" * 64, "rank": 4, "alpha": 8, "target_modules": ["q_proj"],
            "modules_to_save": []}
    for bad, field in (({**good, "rank": 0}, "adapter.rank"), ({**good, "base_sha256": "xyz"}, "adapter.base_sha256"),
                       ({**good, "target_modules": []}, "adapter.target_modules")):
        with pytest.raises(ValueError, match=field):
            await client.publish("m", 1, tmp_path / "a", adapter=bad)
    # the server checks too (another client may not)
    status, _, body = raw_request(srv.url, "POST", "/v1/runs/m/versions/1/commit",
                                  headers={"Content-Type": "application/json"},
                                  body=json.dumps({"files": [], "adapter": {**good, "alpha": -1}}).encode())
    assert status == 400 and b"adapter.alpha" in body
    wv = await client.publish("m", 1, tmp_path / "a", adapter=good)
    m = await client.manifest("m", 1)
    assert m["kind"] == "lora" and m["adapter"] == good and wv.version == 1
    with pytest.raises(WeightStoreError):
        await client.publish("m", 1, tmp_path / "a", adapter=good)  # versions are immutable, as ever
