"""Sampling maths: top-k / top-p / temperature, per-row generators, stop conditions."""

from __future__ import annotations

import pytest
import torch

from rollout_service.engines.base import SamplingParams, check_sampling
from rollout_service.engines.sampling import StopChecker, make_generator, sample_rows

LOGITS = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))


def draws(p: SamplingParams, n: int = 4000, seed: int = 0) -> torch.Tensor:
    g = make_generator(seed)
    return torch.cat([sample_rows(LOGITS[None], [p], [g]) for _ in range(n)])


def test_temperature_one_samples_the_softmax():
    freq = torch.bincount(draws(SamplingParams()), minlength=4).float() / 4000
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03, rtol=0)


def test_top_k_and_top_p_keep_only_the_most_likely_tokens():
    assert set(draws(SamplingParams(top_k=2), 2000).tolist()) == {0, 1}
    # mass before token 2 is 0.8 >= 0.8: tokens 0 and 1 only; the top token always survives
    assert set(draws(SamplingParams(top_p=0.8), 2000).tolist()) == {0, 1}
    assert set(draws(SamplingParams(top_p=0.01), 500).tolist()) == {0}
    assert set(draws(SamplingParams(temperature=0.0), 10).tolist()) == {0}


def test_a_row_draws_the_same_token_alone_or_in_a_batch():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=t, top_k=k, top_p=q) for t, k, q in
              [(1.0, 0, 1.0), (0.7, 10, 1.0), (1.3, 0, 0.9), (0.0, 0, 1.0), (1.0, 3, 0.5)]]  # fmt: skip
    together = sample_rows(logits, params, [make_generator(10 + i) for i in range(5)])
    alone = [int(sample_rows(logits[i : i + 1], [params[i]], [make_generator(10 + i)])[0]) for i in range(5)]
    assert together.tolist() == alone


def test_stop_checker_stops_on_eos_stop_ids_strings_and_length():
    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(96 + i) for i in ids)

    c = StopChecker(SamplingParams(max_new_tokens=5, stop=["cd"], stop_token_ids=[9]), 2, Tok())
    assert c.finish_reason([1]) is None and c.finish_reason([1, 2]) == "stop"  # EOS
    assert c.finish_reason([1, 9]) == "stop" and c.finish_reason([3, 4]) == "stop"  # id, then "cd"
    assert c.finish_reason([1, 1, 1, 1, 1]) == "length"
    assert StopChecker(SamplingParams(ignore_eos=True), 2, None).finish_reason([2]) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", -1.0), ("top_p", 0.0), ("top_k", -1), ("max_new_tokens", 0), ("stop", [""])],
)
def test_impossible_sampling_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"sampling.{field}"):
        check_sampling(SamplingParams(**{field: value}))
