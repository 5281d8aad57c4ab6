"""Log-probabilities only at loss positions, in chunks: equal to the full-logits computation, values
and gradients, and the model's head computes no full logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from shared.config import JetrlConfig, load_config
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.logprobs import chunked_token_logprobs, token_logprobs
from trainer_service.packing import TrainItem, pack


@pytest.mark.parametrize("chunk", [1, 3, 64])
@pytest.mark.parametrize("entropy", ["stat", "grad"])
def test_chunked_logprobs_equal_full_logits_values_and_gradients(chunk, entropy):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 8, generator=g, requires_grad=True)
    weight = torch.randn(50, 8, generator=g, requires_grad=True)
    bias = torch.randn(50, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (10,), generator=g)
    coef = torch.randn(10, generator=g)

    lp, ent = chunked_token_logprobs(hidden, weight, bias, targets, chunk=chunk, entropy=entropy)
    grads = torch.autograd.grad((lp * coef).sum() + ent.sum() * (entropy == "grad"), (hidden, weight, bias))
    ref_lp, ref_ent = token_logprobs(hidden @ weight.T + bias, targets, entropy_grad=entropy == "grad")
    ref_grads = torch.autograd.grad((ref_lp * coef).sum() + ref_ent.sum() * (entropy == "grad"),
                                    (hidden, weight, bias))
    assert_close(lp, ref_lp, rtol=1e-5, atol=1e-6)
    assert_close(ent, ref_ent, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, ref_grads, strict=True):
        assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert ent.requires_grad == (entropy == "grad")


def test_chunked_logprobs_reject_bad_arguments():
    h, w, t = torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="entropy mode"):
        chunked_token_logprobs(h, w, None, t, entropy="maybe")
    with pytest.raises(ValueError, match="chunk"):
        chunked_token_logprobs(h, w, None, t, chunk=0)


def _items():
    rng = np.random.default_rng(1)
    out = []
    for n, p in ((12, 5), (20, 9), (7, 3)):
        mask = np.array([0] * p + [1] * (n - p), np.uint8)
        out.append(TrainItem(tokens=rng.integers(4, 60, size=n).astype(np.int32), loss_mask=mask,
                             behav_logp=np.zeros(n, np.float32), advantage=1.0, coef=1.0))
    return out


def test_backend_forward_at_loss_positions_in_chunks_equals_full_logits():
    torch.manual_seed(0)
    backend = FSDPBackend(load_config(JetrlConfig, None, ["trainer.device=cpu", "trainer.logprob_chunk_tokens=4"]))
    m = pack(_items())
    mk = m.mask > 0
    head_out = []
    hook = backend.model.get_output_embeddings().register_forward_hook(lambda mod, a, out: head_out.append(out.shape))
    lp, ent = backend.forward(m, grad=True)
    hook.remove()
    assert head_out and all(s[-2] == 0 for s in head_out), f"the head computed logits: {head_out}"
    params = [p for p in backend.model.parameters() if p.requires_grad]
    grads = torch.autograd.grad((lp * m.mask).sum(), params, allow_unused=True)

    full = backend.model(input_ids=m.input_ids, position_ids=m.position_ids, cu_seq_lens_q=m.cu_seqlens,
                         cu_seq_lens_k=m.cu_seqlens, max_length_q=max(m.lengths), max_length_k=max(m.lengths),
                         use_cache=False).logits[0]
    ref_lp, ref_ent = token_logprobs(full, m.targets)
    ref_grads = torch.autograd.grad((ref_lp * m.mask).sum(), params, allow_unused=True)
    assert_close(lp[mk], ref_lp[mk], rtol=1e-5, atol=1e-5)
    assert_close(ent[mk], ref_ent[mk], rtol=1e-5, atol=1e-5)
    assert torch.all(lp[~mk] == 0)
    for a, b in zip(grads, ref_grads, strict=True):
        if b is None:
            assert a is None or torch.all(a == 0)
        else:
            assert_close(a, b, rtol=1e-4, atol=1e-6)

    # logprob_chunk_tokens=0 (one full-logits pass, then the loss positions) gives the same numbers.
    backend.cfg.trainer.logprob_chunk_tokens = 0
    lp0, ent0 = backend.forward(m)
    assert_close(lp0, lp.detach(), rtol=1e-5, atol=1e-5)
    assert_close(ent0, ent.detach(), rtol=1e-5, atol=1e-5)
