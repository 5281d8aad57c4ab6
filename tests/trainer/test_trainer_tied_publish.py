"""A model with tied input and output embeddings (SmolLM2) is published without its output layer, as
transformers' own save does, and every loader re-ties it: the local engine's swap and from_pretrained
give the trainer's logits after a step."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from rollout_service.engines.local import LocalEngine
from shared.config import JetrlConfig, load_config
from shared.model.tinymodel import build_tiny_model, save_tokenizer
from tests.trainer.fsdp_step_worker import fixed_items
from trainer_service.backends.base import tied_output_keys
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.publish import DirectoryPublisher
from trainer_service.step import train_step


def _tied_dir(out: Path) -> Path:
    cfg = load_config(JetrlConfig, None, [])
    model, tok = build_tiny_model(cfg.model)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    model.save_pretrained(out)
    save_tokenizer(tok, out / "tokenizer")
    return out


def test_tied_output_keys():
    class C:
        tie_word_embeddings = True

    keys = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
    assert tied_output_keys(C(), keys) == {"lm_head.weight"}
    assert tied_output_keys(object(), keys) == set()  # untied (no attribute = transformers' default False)
    assert tied_output_keys(C(), ["lm_head.weight"]) == set()  # no input embedding to re-tie it to


async def test_a_tied_model_publishes_without_its_output_layer_and_loads_as_trained(js, tmp_path):
    base = _tied_dir(tmp_path / "base")
    cfg = load_config(JetrlConfig, None, [f"model.path={base}", "model.dtype=float32", "trainer.device=cpu",
                                          "trainer.optim.lr=0.01", "trainer.micro_batch_tokens=64",
                                          f"trainer.publish_dir={tmp_path / 'pub'}", "run=tied",
                                          "rollout.device=cpu"])
    trainer = FSDPBackend(cfg)
    assert trainer.model.get_output_embeddings().weight is trainer.model.get_input_embeddings().weight
    train_step(trainer, fixed_items(), cfg.trainer)
    sd = trainer.full_state_dict()
    assert "lm_head.weight" not in sd and "model.embed_tokens.weight" in sd
    wv = await DirectoryPublisher(cfg, js).publish(1, 1, sd, trainer.hf_config(), trainer.tokenizer)
    vdir = Path(wv.manifest_url.removeprefix("file://")).parent
    with safe_open(str(vdir / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in set(f.keys())
    assert json.loads((vdir / "config.json").read_text())["tie_word_embeddings"] is True

    ids = torch.tensor([[1, 5, 9, 12, 7, 3]])
    with torch.no_grad():
        want = trainer.model(ids).logits
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(str(vdir), dtype=torch.float32).eval()
        torch.testing.assert_close(loaded(ids).logits, want, atol=1e-5, rtol=0)

        model, tok = build_tiny_model(cfg.model)  # the engine starts on the untrained base, then swaps
        model.config.tie_word_embeddings = True
        model.tie_weights()
        engine = LocalEngine(cfg, model=model.eval(), tokenizer=tok)
        await engine.start()
        try:
            await engine.update_weights(1, path=str(vdir))
            assert engine.version == 1
            torch.testing.assert_close(engine.model(ids).logits, want, atol=1e-5, rtol=0)
            assert engine.model.get_output_embeddings().weight is engine.model.get_input_embeddings().weight
        finally:
            await engine.close()
    trainer.close()
