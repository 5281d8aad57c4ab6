"""PPO minibatches (trainer.algorithm.ppo_minibatches): k = 1 is the old single-step update without its
proximal pass; k > 1 computes pi_prox once before the first minibatch, so the clip acts from the
second minibatch on and the behaviour weight keeps using the pre-update proximal logprobs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from shared.config import JetrlConfig, load_config
from trainer_service import step
from trainer_service.algorithms.losses import decoupled_ppo_terms, policy_terms
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.packing import TrainItem
from trainer_service.step import assign_coefficients, micro_batches_for_rank, split_minibatches, train_step


def _items(n: int = 8, seed: int = 0) -> list[TrainItem]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        length = int(rng.integers(10, 18))
        p = 5
        mask = np.array([0] * p + [1] * (length - p), np.uint8)
        out.append(TrainItem(tokens=rng.integers(4, 60, size=length).astype(np.int32), loss_mask=mask,
                             behav_logp=np.where(mask == 1, rng.uniform(-5, -3, size=length), 0.0).astype(np.float32),
                             advantage=float(rng.normal()), group_id=f"g{k // 4}"))
    return out


def _backend(*overrides: str) -> FSDPBackend:
    torch.manual_seed(0)
    return FSDPBackend(load_config(JetrlConfig, None, ["trainer.device=cpu", "trainer.micro_batch_tokens=40",
                                                        *overrides]))


def _steps_by_hand(backend: FSDPBackend, items, cfg, steps: int = 1) -> None:
    """The update before ppo_minibatches existed (steps = 1): a no-grad proximal pass, then one optimizer
    step of decoupled PPO over the whole batch; steps > 1 repeats the step against the same pi_prox."""
    a = cfg.trainer.algorithm
    assign_coefficients(items, cfg.trainer, 64)
    micro = micro_batches_for_rank(items, cfg.trainer.micro_batch_tokens, 0, 1, lambda n: n, backend.shared_prompts)
    with torch.no_grad():
        prox = [backend.forward(m)[0] for m in micro]
    for _ in range(steps):
        backend.zero_grad()
        for m, p in zip(micro, prox, strict=True):
            logp, _ = backend.forward(m, grad=True)
            terms = decoupled_ppo_terms(logp, p, m.behav_logp, m.advantages, a.eps_clip, a.eps_clip_high,
                                        a.behav_imp_weight_cap, a.behav_imp_weight_mode)
            backend.backward((terms.loss * m.mask * m.coef).sum())
        backend.clip_and_step(cfg.trainer.optim.grad_clip)


def _assert_same_weights(x: FSDPBackend, y: FSDPBackend) -> None:
    for (k, v), (_, w) in zip(x.model.state_dict().items(), y.model.state_dict().items(), strict=True):
        assert_close(v, w, rtol=1e-5, atol=1e-6, msg=f"{k} differs")


def test_minibatch_split_is_contiguous_balanced_and_capped():
    assert [list(r) for r in split_minibatches(7, 3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [list(r) for r in split_minibatches(2, 4)] == [[0], [1]]
    assert [list(r) for r in split_minibatches(5, 1)] == [[0, 1, 2, 3, 4]]


def test_one_minibatch_is_the_old_update_without_a_proximal_pass():
    new = _backend("trainer.optim.lr=1e-2")
    calls = []
    fwd = new.forward
    new.forward = lambda m, which="policy", grad=False: (calls.append(grad), fwd(m, which, grad))[1]
    stats = train_step(new, _items(), new.cfg.trainer)
    assert calls and all(calls), "k = 1 must run no no-grad (proximal) forward"
    assert stats["ppo_minibatches"] == 1 and stats["micro_batches"] == len(calls)
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == pytest.approx(1.0)

    old = _backend("trainer.optim.lr=1e-2")
    _steps_by_hand(old, _items(), old.cfg)
    _assert_same_weights(new, old)
    init = _backend().model.state_dict()
    assert any(not torch.allclose(v, new.model.state_dict()[k]) for k, v in init.items()), "the step moved nothing"


def test_later_minibatches_clip_against_the_proximal_policy_from_before_the_first(monkeypatch):
    overrides = ("trainer.optim.lr=5e-2", "trainer.optim.grad_clip=0", "trainer.algorithm.eps_clip=0.02",
                 "trainer.algorithm.behav_imp_weight_cap=null", "trainer.algorithm.ppo_minibatches=2")
    backend = _backend(*overrides)
    items = _items()
    # pi_prox must be the policy before any update: the logprobs of a fresh copy of the initial model.
    initial = _backend(*overrides)
    seen = []

    def spy(objective, logp, prox_logp, behav_logp, advantages, **kw):
        terms = policy_terms(objective, logp, prox_logp, behav_logp, advantages, **kw)
        seen.append((logp.detach().clone(), prox_logp.clone(), behav_logp.clone(), terms))
        return terms

    monkeypatch.setattr(step, "policy_terms", spy)
    stats = train_step(backend, items, backend.cfg.trainer)
    assert stats["ppo_minibatches"] == 2
    first, second = stats["minibatch_clip_frac"]
    assert first == 0.0, "before any optimizer step pi_theta = pi_prox: nothing to clip"
    assert second > 0.0, "after the first step the ratio leaves [1 - eps, 1 + eps] on some tokens"
    assert stats["clip_frac"] > 0.0

    # The second minibatch's micro-batches are the last calls; recompute them on the initial model.
    halves = [[items[i] for i in r] for r in split_minibatches(len(items), 2)]
    micro2 = micro_batches_for_rank(halves[1], backend.cfg.trainer.micro_batch_tokens, 0, 1, lambda n: n,
                                    backend.shared_prompts)
    for m, (logp, prox, behav, terms) in zip(micro2, seen[-len(micro2):], strict=True):
        mk = m.mask > 0
        with torch.no_grad():
            want = initial.forward(m)[0]
        assert_close(prox[mk], want[mk], rtol=1e-5, atol=1e-5)
        assert_close(terms.behav_weight[mk], torch.exp(want - behav)[mk], rtol=1e-5, atol=1e-5)
        # ... and not the moved policy's logprobs.
        assert (logp[mk] - prox[mk]).abs().max() > 1e-3


def test_epochs_pass_over_the_batch_again_against_the_first_proximal_policy():
    """ppo_epochs = 2, one minibatch: two optimizer steps on the same batch, both clipped against pi_prox
    from before the first, the same as doing it by hand."""
    overrides = ("trainer.optim.lr=5e-2", "trainer.optim.grad_clip=0", "trainer.algorithm.eps_clip=0.02",
                 "trainer.algorithm.behav_imp_weight_cap=null")
    backend = _backend(*overrides, "trainer.algorithm.ppo_epochs=2")
    stats = train_step(backend, _items(), backend.cfg.trainer)
    assert stats["ppo_epochs"] == 2 and stats["ppo_minibatches"] == 1 and len(stats["minibatch_loss"]) == 2
    first, second = stats["minibatch_clip_frac"]
    assert first == 0.0 and second > 0.0, "the second pass's ratio is against the policy before the first"
    assert stats["loss_tokens"] == sum(int(it.loss_mask.sum()) for it in _items()), "tokens count once"

    ref = _backend(*overrides)
    _steps_by_hand(ref, _items(), ref.cfg, steps=2)
    _assert_same_weights(backend, ref)

    once = _backend(*overrides)
    train_step(once, _items(), once.cfg.trainer)
    assert any(not torch.allclose(v, once.model.state_dict()[k]) for k, v in backend.model.state_dict().items()), \
        "the second pass moved nothing"


def test_the_lr_schedule_counts_every_pass():
    cfg = load_config(JetrlConfig, None, ["trainer.optim.lr_schedule=linear", "trainer.optim.min_lr_ratio=0",
                                          "trainer.algorithm.ppo_minibatches=2", "trainer.algorithm.ppo_epochs=3"])
    f = step.lr_lambda(cfg.trainer, total_steps=10)
    assert f(0) == pytest.approx(1.0) and f(30) == pytest.approx(0.5) and f(60) == pytest.approx(0.0)
