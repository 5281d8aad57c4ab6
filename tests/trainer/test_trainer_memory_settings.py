"""The memory settings examples/smollm2_gsm8k.yaml uses for a pretrained model on CPU
(activation_checkpointing on, small micro-batches) change memory only, not the update: one optimizer
step of a tiny Llama-architecture model saved as a model dir (the SmolLM2 layout: tied embeddings,
grouped-query attention) gives the same weights with and without them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from ci_gate import need_module
from torch.testing import assert_close
from trainer_testlib import save_tiny_llama
from transformers import LlamaForCausalLM

from shared.config import JetrlConfig
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.packing import TrainItem
from trainer_service.step import train_step


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def _config(llama_dir, trainer: dict) -> JetrlConfig:
    """The tiny Llama on CPU in float32, with these trainer settings."""
    return JetrlConfig.model_validate({
        "model": {"path": str(llama_dir / "model"), "tokenizer": str(llama_dir / "tokenizer"), "dtype": "float32"},
        "trainer": {"device": "cpu", **trainer}})


def _items() -> list[TrainItem]:
    rng = np.random.default_rng(3)
    items = []
    for k, n in enumerate((40, 75, 22, 61, 90, 33, 57, 48)):
        p = 12
        mask = np.array([0] * p + [1] * (n - p), np.uint8)
        items.append(TrainItem(tokens=rng.integers(4, 80, size=n).astype(np.int32), loss_mask=mask,
                               behav_logp=np.where(mask == 1, rng.uniform(-5, -3, size=n), 0.0).astype(np.float32),
                               advantage=float(rng.normal()), group_id=f"g{k // 4}"))
    return items


def _step(llama_dir, checkpointing: bool, micro_tokens: int) -> tuple[dict, dict]:
    cfg = _config(llama_dir, {"activation_checkpointing": checkpointing, "micro_batch_tokens": micro_tokens,
                              "optim": {"lr": 0.01, "adam_eps": 1e-4, "grad_clip": 1.0}})
    backend = FSDPBackend(cfg)
    stats = train_step(backend, _items(), cfg.trainer)
    return backend.full_state_dict(), stats


def test_checkpointing_and_small_micro_batches_give_the_same_step(llama_dir):
    torch.set_num_threads(1)
    base_sd, base = _step(llama_dir, checkpointing=False, micro_tokens=4096)
    small_sd, small = _step(llama_dir, checkpointing=True, micro_tokens=128)
    assert base["micro_batches"] == 1 and small["micro_batches"] >= 4
    assert small["loss_tokens"] == base["loss_tokens"]
    assert small["loss"] == pytest.approx(base["loss"], abs=1e-5)
    assert small["grad_norm"] == pytest.approx(base["grad_norm"], rel=1e-4)
    init = LlamaForCausalLM.from_pretrained(llama_dir / "model").state_dict()
    for k, v in base_sd.items():
        assert_close(small_sd[k], v, rtol=1e-4, atol=2e-5, msg=f"{k} differs")
    assert not torch.allclose(base_sd["model.embed_tokens.weight"], init["model.embed_tokens.weight"])


def test_the_gradients_are_freed_after_the_step(llama_dir):
    """A step lets go of its gradients at once: they are not held while the version publishes."""
    cfg = _config(llama_dir, {"algorithm": {"ppo_minibatches": 2}})
    backend = FSDPBackend(cfg)
    stats = train_step(backend, _items(), cfg.trainer)
    assert stats["ppo_minibatches"] == 2 and stats["grad_norm"] > 0
    assert all(p.grad is None for p in backend.model.parameters())


RELEASE = """
import torch
from trainer_service.memory import release_freed_memory

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

keep, free = [], []
for i in range(4000):  # 64 KiB tensors come from malloc's heap; every 50th stays, pinning the heap's top
    (keep if i % 50 == 0 else free).append(torch.ones(16 * 1024))
del free
before = rss()
released = release_freed_memory()
print(released, (before - rss()) / 2**20)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="malloc_trim is glibc's (Linux)")
def test_release_memory_hands_freed_heap_pages_back():
    """trainer.release_memory: ~245 MiB freed in holes between live blocks stay resident until
    release_freed_memory() returns them to the OS."""
    out = subprocess.run([sys.executable, "-c", RELEASE], capture_output=True, text=True, check=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    released, mib = out.stdout.split()
    assert released == "True" and float(mib) > 150, out.stdout


def _backend_8bit(llama_dir) -> FSDPBackend:
    return FSDPBackend(_config(llama_dir, {"optim": {"name": "adamw_8bit", "lr": 0.01, "adam_eps": 1e-4}}))


def test_adamw_8bit_keeps_8_bit_moments_and_resumes_from_a_checkpoint(llama_dir, tmp_path):
    """trainer.optim.name adamw_8bit (bitsandbytes): the large tensors' moments are uint8, the update moves
    the weights, and a checkpoint restores the quantized state so the next step is the same."""
    need_module("bitsandbytes", "bnb or dev extra")
    torch.set_num_threads(1)
    a = _backend_8bit(llama_dir)
    train_step(a, _items(), a.cfg.trainer)
    embed = a.model.get_input_embeddings().weight
    state = a.optimizer.state[embed]
    assert state["state1"].dtype == torch.uint8 and state["state2"].dtype == torch.uint8
    assert state["state1"].numel() == embed.numel()
    a.save_checkpoint(str(tmp_path / "ck"), {"step": 1})
    b = _backend_8bit(llama_dir)
    b.load_checkpoint(str(tmp_path / "ck"))
    assert torch.equal(b.optimizer.state[b.model.get_input_embeddings().weight]["state1"], state["state1"])
    train_step(a, _items(), a.cfg.trainer)
    train_step(b, _items(), b.cfg.trainer)
    sa, sb = a.full_state_dict(), b.full_state_dict()
    init = LlamaForCausalLM.from_pretrained(llama_dir / "model").state_dict()
    for k, v in sa.items():
        assert_close(sb[k], v, rtol=0, atol=1e-6, msg=f"{k} differs after the resumed step")
    assert not torch.allclose(sa["model.embed_tokens.weight"], init["model.embed_tokens.weight"])
