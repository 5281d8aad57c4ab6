"""Sequence packing: token-budget micro-batches, and packed logprobs equal per-sequence logprobs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from shared.config import JetrlConfig, load_config
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.packing import TrainItem, pack, plan_micro_batches, split_for_ranks


def _item(tokens, gen_from):
    n = len(tokens)
    mask = np.array([0] * gen_from + [1] * (n - gen_from), np.uint8)
    return TrainItem(tokens=np.array(tokens, np.int32), loss_mask=mask, behav_logp=np.zeros(n, np.float32),
                     advantage=1.0, coef=1.0)


def test_micro_batches_respect_the_token_budget_and_cover_every_item_once():
    lengths = [7, 3, 9, 1, 4, 4, 12]
    plan = plan_micro_batches(lengths, budget=10)
    flat = sorted(i for b in plan for i in b)
    assert flat == list(range(len(lengths)))
    for b in plan:
        assert sum(lengths[i] for i in b) <= 10 or len(b) == 1  # the 12-token item alone
    assert [6] in plan


def test_rank_split_balances_tokens():
    shares = split_for_ranks([10, 9, 2, 1], world=2)
    assert shares == [[0, 3], [1, 2]]


def test_pack_shifts_targets_inside_each_sequence():
    pb = pack([_item([5, 6, 7], 1), _item([8, 9], 1)])
    assert pb.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert pb.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert pb.targets.tolist() == [6, 7, 0, 9, 0]
    assert pb.mask.tolist() == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert pb.cu_seqlens.tolist() == [0, 3, 5]


@pytest.mark.parametrize("attn", ["varlen", "sdpa", "eager"])
def test_packed_logprobs_equal_per_sequence_logprobs(attn):
    backend = FSDPBackend(load_config(JetrlConfig, None, [f"trainer.attn_implementation={attn}"]))
    rng = np.random.default_rng(0)
    items = [_item(rng.integers(4, 60, size=n).tolist(), 2) for n in (9, 17, 5, 30)]
    packed_lp, packed_ent = backend.forward(pack(items))
    singles = [backend.forward(pack([it])) for it in items]
    assert_close(packed_lp, torch.cat([s[0] for s in singles]), rtol=1e-5, atol=1e-5)
    assert_close(packed_ent, torch.cat([s[1] for s in singles]), rtol=1e-5, atol=1e-5)
    # Without restarting positions the sequences would attend across boundaries: a different answer.
    pb = pack(items)
    with torch.no_grad():
        leaky = backend.model(input_ids=pb.input_ids, position_ids=torch.arange(pb.num_tokens)[None],
                              cu_seq_lens_q=torch.tensor([0, pb.num_tokens])).logits[0]
    leaky_lp = torch.log_softmax(leaky.float(), -1).gather(-1, pb.targets[:, None]).squeeze(-1)
    n0 = items[0].length
    assert not torch.allclose(leaky_lp[n0:], packed_lp[n0:], atol=1e-3)
