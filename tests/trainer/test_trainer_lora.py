"""trainer.lora on the FSDP backend: only the adapter trains, 2 ranks = 1 process, checkpoints hold only
the adapter and a resumed run (1 or 2 ranks) continues exactly."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from shared.config import JetrlConfig, load_config
from shared.model.tinymodel import build_tiny_model
from tests.trainer.fsdp_step_worker import fixed_items
from tests.trainer.test_trainer_fsdp import _run
from trainer_service import checkpoint
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.step import train_step

LORA = ["trainer.lora.rank=4", "trainer.lora.alpha=8", "trainer.lora.target_modules=[q_proj,v_proj,down_proj]"]


def _cfg(*extra: str) -> JetrlConfig:
    return load_config(JetrlConfig, None, ["trainer.optim.lr=0.01", "trainer.optim.adam_eps=1e-4",
                                           "trainer.micro_batch_tokens=32", "trainer.device=cpu", *LORA, *extra])


def _base_params(backend) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in backend.model.named_parameters()}


def test_a_lora_step_updates_only_the_adapter():
    cfg = _cfg("trainer.lora.modules_to_save=[lm_head]")
    b = FSDPBackend(cfg)
    before = _base_params(b)
    trainable = {n for n, p in b.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or "modules_to_save" in n for n in trainable)
    opt_params = {id(p) for g in b.optimizer.param_groups for p in g["params"]}
    assert opt_params == {id(p) for p in b.model.parameters() if p.requires_grad}
    train_step(b, fixed_items()[:3], cfg.trainer)
    for n, p in b.model.named_parameters():
        moved = not torch.equal(p.detach(), before[n])
        if "lora_B" in n or "modules_to_save" in n:
            assert moved, f"{n} did not move"  # lora_A moves too, but B starts at 0 so A's first grad is 0
        elif n not in trainable:
            assert not moved, f"frozen {n} moved"
    adapter = b.full_state_dict()
    assert set(adapter) and all(".lora_A." in k or ".lora_B." in k or k.endswith("lm_head.weight") for k in adapter)
    assert len([k for k in adapter if ".lora_A." in k]) == 2 * 3  # 2 layers x 3 target modules
    b.close()


def test_the_kl_reference_is_the_base_model():
    cfg = _cfg("trainer.algorithm.kl_coef=0.1")
    b = FSDPBackend(cfg)
    assert b.ref is None
    from trainer_service.packing import pack

    mb = pack(fixed_items()[:2])
    base, _ = build_tiny_model(cfg.model)
    b.model.base_model.model.model.layers[0].self_attn.q_proj.lora_B.default.weight.data.fill_(0.5)
    pol, _ = b.forward(mb, "policy")
    ref, _ = b.forward(mb, "ref")
    base_b = FSDPBackend(_cfg())  # untouched adapter (B = 0) = the base model
    ref0, _ = base_b.forward(mb, "policy")
    assert_close(ref, ref0, rtol=0, atol=1e-6)
    assert not torch.allclose(pol, ref, atol=1e-4)
    b.close()
    base_b.close()


def test_checkpoints_hold_only_the_adapter_and_resume_continues_exactly(tmp_path):
    cfg = _cfg("trainer.lora.dropout=0.1", "trainer.optim.lr_schedule=linear", "trainer.optim.decay_steps=5")
    items = fixed_items()
    a = FSDPBackend(cfg)
    train_step(a, items[:3], cfg.trainer)
    path = tmp_path / "step-1"
    a.save_checkpoint(str(path), {"step": 1})
    stats_a = [train_step(a, items[3:], cfg.trainer), train_step(a, items[:4], cfg.trainer)]
    after_a = a.full_state_dict()

    import torch.distributed.checkpoint as dcp

    keys = set(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    model_keys = {k for k in keys if k.startswith("model.")}
    assert model_keys and all("lora_" in k for k in model_keys), sorted(model_keys)[:5]
    assert not any("lora_" not in k for k in keys if k.startswith("optim.state."))
    (path / checkpoint.COMPLETE).write_text("ok\n")  # save() writes it on rank 0 of a real run

    torch.manual_seed(123)  # the resumed process's RNG differs until the checkpoint restores it
    b = FSDPBackend(cfg)
    assert b.load_checkpoint(str(path)) == {"step": 1}
    stats_b = [train_step(b, items[3:], cfg.trainer), train_step(b, items[:4], cfg.trainer)]
    after_b = b.full_state_dict()
    assert set(after_a) == set(after_b)
    for k in after_a:
        assert torch.equal(after_a[k], after_b[k]), k
    assert [s["loss"] for s in stats_a] == [s["loss"] for s in stats_b]
    assert b.current_lr() == a.current_lr()
    a.close()
    b.close()


@pytest.mark.slow
def test_two_rank_fsdp_lora_step_matches_one_process(tmp_path):
    one = _run(1, tmp_path / "one.pt", LORA)
    two = _run(2, tmp_path / "two.pt", LORA)
    assert one["world"] == 1 and two["world"] == 2
    assert set(one["state"]) == set(two["state"])
    assert len(one["state"]) == 2 * 3 * 2  # A and B of 3 modules in 2 layers: nothing of the base
    for k, v in one["state"].items():
        assert_close(two["state"][k], v, rtol=1e-4, atol=2e-5, msg=f"{k} differs between 1 and 2 ranks")
    assert any(torch.count_nonzero(v) for k, v in one["state"].items() if "lora_B" in k)
    assert abs(one["stats"]["loss"] - two["stats"]["loss"]) < 1e-5


@pytest.mark.slow
def test_a_two_rank_lora_run_resumed_from_its_checkpoint_continues_exactly(tmp_path):
    ck = tmp_path / "step-1"
    straight = _run(2, tmp_path / "straight.pt", LORA, ckpt=f"{ck}:save")
    (ck / checkpoint.COMPLETE).write_text("ok\n")  # save() writes it on rank 0 of a real run
    resumed = _run(2, tmp_path / "resumed.pt", LORA, ckpt=f"{ck}:resume")
    assert straight["world"] == resumed["world"] == 2
    assert set(straight["state"]) == set(resumed["state"]) and len(straight["state"]) == 2 * 3 * 2
    for k, v in straight["state"].items():
        assert torch.equal(resumed["state"][k], v), k
    assert straight["stats"]["loss"] == resumed["stats"]["loss"]


@pytest.mark.parametrize("overrides,field", [
    (["trainer.backend=megatron"], "trainer.lora"),
    (["trainer.backend=sim"], "trainer.lora"),
    (["trainer.lora.rank=0"], "rank"),
    (["trainer.lora.target_modules=[]"], "target_modules"),
    (["trainer.lora.target_modules=['q proj']"], "trainer.lora.target_modules"),
    (["trainer.lora.modules_to_save=[q_proj]", "trainer.lora.target_modules=[q_proj]"],
     "trainer.lora.modules_to_save"),
])
def test_bad_lora_config_fails_at_load_naming_the_field(overrides, field):
    from shared.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match=field.replace(".", r"\.")):
        load_config(JetrlConfig, None, ["trainer.lora.rank=4", *overrides])


def test_unknown_target_modules_fail_naming_the_field():
    with pytest.raises(ValueError, match=r"trainer\.lora\.target_modules"):
        FSDPBackend(_cfg("trainer.lora.target_modules=[no_such_proj]"))
