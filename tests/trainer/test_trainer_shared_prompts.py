"""Shared-prompt packing: a group's prompt packed once, each completion attending to it and to itself,
gives the same per-token logprobs and the same gradients as unshared packing (float32, 1e-5), for
groups of different prompt and completion lengths, also when a group spans micro-batches. The backend
tests run on the CPU and, on a machine with a CUDA GPU (`pytest -m gpu`), again on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from shared.config import JetrlConfig, load_config
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.packing import (
    TrainItem,
    pack,
    pack_shared,
    plan_shared_micro_batches,
    shared_prefix_length,
)
from trainer_service.step import train_step


def _groups(seed: int = 0) -> list[TrainItem]:
    """Three groups: prompts of 7, 12 and 4 tokens; completions of 2-9 tokens, some starting alike."""
    rng = np.random.default_rng(seed)
    items = []
    for g, (plen, comp_lens) in enumerate(((7, (3, 9, 5)), (12, (2, 6, 6, 8)), (4, (5, 3)))):
        prompt = rng.integers(4, 60, size=plen)
        first = int(rng.integers(4, 60))
        for k, c in enumerate(comp_lens):
            comp = rng.integers(4, 60, size=c)
            if k < 2:
                comp[0] = first  # two completions share their first generated token: still not shared
            tokens = np.concatenate([prompt, comp]).astype(np.int32)
            mask = np.array([0] * plen + [1] * c, np.uint8)
            items.append(TrainItem(tokens=tokens, loss_mask=mask,
                                   behav_logp=np.where(mask == 1, rng.uniform(-5, -3, size=plen + c), 0).astype(np.float32),
                                   advantage=float(rng.normal()), coef=float(rng.uniform(0.5, 1.5)), group_id=f"g{g}"))
    return items


CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                         reason="needs a CUDA GPU")])


@pytest.fixture(scope="module", params=["cpu", CUDA])
def backend(request):
    torch.manual_seed(0)
    # float32 on both devices (on CUDA `auto` would train in bf16)
    return FSDPBackend(load_config(JetrlConfig, None, [f"trainer.device={request.param}", "trainer.dtype=float32"]))


def _tol(backend) -> dict:
    """float32 on the CPU: 1e-5; on a GPU the kernels sum in other orders (and atomically in backward)."""
    return dict(rtol=1e-5, atol=1e-5) if backend.device.type == "cpu" else dict(rtol=1e-4, atol=1e-4)


def _per_item(m, lp, n_items):
    return [lp[(m.seq_index == k) & (m.mask > 0)] for k in range(n_items)]


def _grads(backend, batches):
    backend.zero_grad()
    for m in batches:
        lp, _ = backend.forward(m, grad=True)
        backend.backward((lp * m.mask * m.coef * m.advantages).sum())
    return {n: p.grad.detach().clone() for n, p in backend.model.named_parameters() if p.grad is not None}


def test_prefix_stops_before_the_first_generated_token():
    items = _groups()
    assert [shared_prefix_length(items[a:b]) for a, b in ((0, 3), (3, 7), (7, 9))] == [6, 11, 3]
    assert shared_prefix_length(items[:1]) == 0 and shared_prefix_length([items[0], items[3]]) == 0
    m = pack_shared(items)
    assert m.num_tokens == sum(it.length for it in items) - (6 * 2 + 11 * 3 + 3 * 1)
    assert m.segments[0][:2] == (0, 6) and m.segments[0][2] == [items[k].length - 6 for k in range(3)]
    # Branch positions continue after the prefix.
    assert m.position_ids[0, 6:6 + items[0].length - 6].tolist() == list(range(6, items[0].length))


def test_shared_packing_gives_the_same_logprobs_and_gradients(backend):
    items = _groups()
    shared, flat = pack_shared(items).to(backend.device), pack(items).to(backend.device)
    lp_s, ent_s = backend.forward(shared)
    lp_f, ent_f = backend.forward(flat)
    for a, b in zip(_per_item(shared, lp_s, len(items)), _per_item(flat, lp_f, len(items)), strict=True):
        assert len(a) and len(a) == len(b)
        assert_close(a, b, **_tol(backend))
    for a, b in zip(_per_item(shared, ent_s, len(items)), _per_item(flat, ent_f, len(items)), strict=True):
        assert_close(a, b, **_tol(backend))
    g_s, g_f = _grads(backend, [shared]), _grads(backend, [flat])
    assert g_s.keys() == g_f.keys() and g_s
    for k in g_f:
        assert_close(g_s[k], g_f[k], **_tol(backend), msg=f"{k} gradient differs")
    # Without the branch mask (the prefix packed once, plain causal attention over the whole row) the
    # completions would see each other: a different answer.
    with torch.no_grad():
        leaky = backend.model(input_ids=shared.input_ids, position_ids=shared.position_ids).logits[0]
    leaky_lp = torch.log_softmax(leaky, -1).gather(-1, shared.targets[:, None]).squeeze(-1)
    assert not torch.allclose(leaky_lp[shared.mask > 0], lp_s[shared.mask > 0], atol=1e-3)


def test_groups_spanning_micro_batches_give_the_same_gradients(backend):
    items = _groups(seed=1)
    plan = plan_shared_micro_batches(items, budget=30)
    assert len(plan) > 2
    spans = [sum(1 for b in plan if any(items[i].group_id == g for i in b)) for g in ("g0", "g1", "g2")]
    assert max(spans) > 1, f"no group spans micro-batches: {plan}"
    assert sorted(i for b in plan for i in b) == list(range(len(items)))
    shared = [pack_shared([items[i] for i in b]).to(backend.device) for b in plan]
    g_s, g_f = _grads(backend, shared), _grads(backend, [pack(items).to(backend.device)])
    for k in g_f:
        assert_close(g_s[k], g_f[k], **_tol(backend), msg=f"{k} gradient differs")


def test_train_step_with_and_without_shared_prompts_is_the_same_update():
    def run(shared: bool):
        torch.manual_seed(0)
        b = FSDPBackend(load_config(JetrlConfig, None, [
            "trainer.device=cpu", "trainer.micro_batch_tokens=40", f"trainer.shared_prompt_packing={shared}",
            "trainer.algorithm.ppo_minibatches=2", "trainer.optim.lr=1e-2",
            "trainer.optim.adam_eps=1e-4"]))  # Adam would blow up the float noise of zero gradients (k bias)
        assert b.shared_prompts == shared
        stats = train_step(b, _groups(seed=2), b.cfg.trainer)
        return b.model.state_dict(), stats

    sd_s, st_s = run(True)
    sd_f, st_f = run(False)
    assert st_s["tokens"] < st_f["tokens"] and st_s["loss_tokens"] == st_f["loss_tokens"]
    assert st_s["loss"] == pytest.approx(st_f["loss"], abs=1e-5)
    for k in sd_f:
        assert_close(sd_s[k], sd_f[k], rtol=1e-5, atol=1e-5, msg=f"{k} differs")
