"""LoRA versions end to end: the trainer publishes only the adapter, a worker fetches and merges it into
the local engine (whose logprobs then equal the trainer's), and a worker refuses an adapter trained on
another base, with a `weights_refused` event."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import torch
from rollout_doubles import ScriptedEngine, worker_config

from rollout_service.engines.base import GenerateRequest, SamplingParams
from rollout_service.engines.local import LocalEngine
from rollout_service.service import RolloutWorker
from shared.config import JetrlConfig, load_config
from shared.contract import bus, codec, subjects
from shared.contract.messages import Event
from shared.model.tinymodel import build_tokenizer, load_policy
from tests.trainer.fsdp_step_worker import fixed_items
from tests.weights.weights_helpers import ThreadServer, raw_request, store_config
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.packing import TrainItem, pack
from trainer_service.publish import DirectoryPublisher, StorePublisher
from trainer_service.step import train_step
from weight_store.announce import latest, watch
from weight_store.client import WeightStoreClient

LORA = ["trainer.lora.rank=4", "trainer.lora.alpha=8", "trainer.lora.target_modules=[q_proj,v_proj,up_proj]",
        "trainer.lora.modules_to_save=[lm_head]", "trainer.optim.lr=0.05", "trainer.device=cpu",
        "trainer.micro_batch_tokens=64", "rollout.device=cpu"]


def _metric(url: str, name: str) -> float:
    _, _, body = raw_request(url, target="/metrics")
    line = next(li for li in body.decode().splitlines() if li.startswith(name))
    return float(line.rsplit(" ", 1)[1])


async def test_publish_fetch_apply_moves_only_adapter_bytes_and_merged_logprobs_equal_the_trainers(js, tmp_path):
    srv = ThreadServer(store_config(tmp_path / "root")).start()
    try:
        cfg = load_config(JetrlConfig, None, [*LORA, "run=lora1"])
        cfg.weights = srv.cfg
        trainer = FSDPBackend(cfg)
        for _ in range(2):
            train_step(trainer, fixed_items(), cfg.trainer)
        pub = StorePublisher(cfg, js)
        wv = await pub.publish(1, 2, trainer.full_state_dict(), trainer.hf_config(), trainer.tokenizer)
        assert (await latest(js, "lora1")).version == 1
        client = WeightStoreClient(srv.cfg)
        manifest = await client.manifest("lora1", 1)
        assert manifest["kind"] == "lora"
        a = manifest["adapter"]
        assert a["rank"] == 4 and a["alpha"] == 8 and a["target_modules"] == ["q_proj", "up_proj", "v_proj"]
        assert a["modules_to_save"] == ["lm_head"] and len(a["base_sha256"]) == 64
        assert sorted(f["name"] for f in wv.files) == ["adapter_config.json", "adapter_model.safetensors"]

        path = await client.fetch("lora1", 1)
        adapter_bytes = sum(f["size"] for f in manifest["files"])
        assert _metric(srv.url, "jetrl_weights_bytes_in_total") == adapter_bytes
        assert _metric(srv.url, "jetrl_weights_bytes_out_total") == adapter_bytes
        base, tok = load_policy(cfg.model)
        full_bytes = sum(t.numel() * t.element_size() for t in base.state_dict().values())
        lm_head = base.lm_head.weight.numel() * 4
        assert adapter_bytes - lm_head < 0.1 * (full_bytes - lm_head)  # the adapters proper: a fraction

        engine = LocalEngine(cfg, model=base, tokenizer=tok)
        await engine.start()
        try:
            prompt = [5, 9, 14, 22, 7]
            before = await engine.generate(GenerateRequest(prompt, SamplingParams(temperature=0, max_new_tokens=6,
                                                                                  ignore_eos=True)))
            await engine.update_weights(1, path=str(path))
            assert engine.version == 1
            res = await engine.generate(GenerateRequest(prompt, SamplingParams(temperature=0, max_new_tokens=6,
                                                                               ignore_eos=True)))
            assert res.versions == [1] * 6
            toks = np.array(prompt + res.output_ids, np.int32)
            mask = np.array([0] * len(prompt) + [1] * 6, np.uint8)
            item = TrainItem(tokens=toks, loss_mask=mask, behav_logp=np.zeros(len(toks), np.float32), advantage=0.0,
                             group_id="g")
            m = pack([item])
            lp, _ = trainer.forward(m, "policy")
            ours = lp[len(prompt) - 1: len(prompt) - 1 + 6]
            assert torch.allclose(ours, torch.tensor(res.logprobs), atol=1e-4, rtol=0), (ours, res.logprobs)
            assert not np.allclose(before.logprobs, res.logprobs, atol=1e-3)  # the adapter changed the policy
            # a second adapter replaces the first (no accumulation): back to version 1's weights = same logprobs
            await engine.update_weights(2, path=str(path))
            again = await engine.generate(GenerateRequest(prompt, SamplingParams(temperature=0, max_new_tokens=6,
                                                                                 ignore_eos=True)))
            assert np.allclose(again.logprobs, res.logprobs, atol=1e-6)
        finally:
            await engine.close()
        trainer.close()
    finally:
        srv.stop()


async def test_a_worker_refuses_an_adapter_on_another_base_with_an_event(nats_config, nc, js, tmp_path):
    run = "lora2"
    tcfg = load_config(JetrlConfig, None, [*LORA, f"run={run}", "trainer.publisher=directory",
                                           f"trainer.publish_dir={tmp_path}"])
    trainer = FSDPBackend(tcfg)
    await DirectoryPublisher(tcfg, js).publish(1, 1, trainer.full_state_dict(), None, None)
    trainer.close()

    wcfg = worker_config(nats_config.servers[0], run)
    wcfg.model.seed = 1  # the worker serves another base model
    tok = build_tokenizer()
    fetched: list[int] = []

    async def fetch(r: str, v: int):
        fetched.append(v)
        return tmp_path / r / f"v{v:08d}"

    events = await nc.subscribe(subjects.events(run, "rollout"))
    await bus.flush(nc)
    engine = ScriptedEngine(tok, lambda p, n: " 1")
    worker = RolloutWorker(wcfg, engine=engine, tokenizer=tok, instance="w-lora",
                           weights=(lambda: watch(js, run), fetch, lambda: latest(js, run)))
    task = asyncio.create_task(worker.run())
    try:
        refused = None
        while refused is None:
            msg = await events.next_msg(timeout=30)
            ev = codec.decode(msg.data, Event)
            if ev.kind == "weights_refused":
                refused = ev
        assert refused.data["version"] == 1 and refused.data["worker"] == "w-lora"
        assert "LoRA adapter on base" in refused.data["error"] and "seed=0" in refused.data["error"]
        assert "seed=1" in refused.data["error"]
        await asyncio.sleep(1.5)  # not retried, never applied
        assert engine.version == 0 and fetched == [1] and worker.follower.lag == 1
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
    manifest = json.loads((tmp_path / run / "v00000001" / "manifest.json").read_text())
    assert manifest["kind"] == "lora"
