"""The `sim` training backend (benchmarks): the step-cost model against hand values, and a simulated step
that sleeps that long, leaves the real weights unchanged and reports the statistics a real step reports."""

import numpy as np
import pytest
import torch

from shared.config import JetrlConfig
from shared.config.trainer import SimTrainerConfig
from trainer_service.backends import make_backend
from trainer_service.backends.sim import step_cost_s
from trainer_service.packing import TrainItem
from trainer_service.service import execute


def items(n: int, length: int) -> list[TrainItem]:
    rng = np.random.default_rng(0)
    mask = np.array([0] * 4 + [1] * (length - 4), np.int32)
    return [TrainItem(tokens=rng.integers(4, 60, size=length).astype(np.int32), loss_mask=mask,
                      behav_logp=np.full(length, -1.0, np.float32), advantage=1.0 if i % 2 else -1.0)
            for i in range(n)]


def test_step_cost_is_base_plus_per_sample_plus_per_token():
    o = SimTrainerConfig(step_base_s=0.5, s_per_sample=0.01, s_per_token=1e-4)
    # 0.5 + 10 x 0.01 + 1000 x 1e-4 = 0.7
    assert step_cost_s(o, samples=10, tokens=1000) == pytest.approx(0.7)
    assert step_cost_s(SimTrainerConfig(step_base_s=0.0), samples=10, tokens=1000) == 0.0


def test_sim_train_step_sleeps_the_cost_keeps_the_weights_and_reports_real_step_keys():
    cfg = JetrlConfig.model_validate({"trainer": {"backend": "sim", "device": "cpu",
                                                  "sim": {"step_base_s": 0.2, "s_per_token": 1e-3}}})
    backend = make_backend(cfg)
    before = {k: v.clone() for k, v in backend.full_state_dict().items()}
    batch = items(4, 20)  # 80 tokens: 0.2 + 0.08 = 0.28 s
    stats = execute(backend, {"kind": "step", "items": batch}, cfg)
    assert stats["simulated"] == 1 and stats["simulated_cost_s"] == pytest.approx(0.28)
    assert stats["step_time_s"] >= 0.28 and stats["tokens"] == 80 and stats["loss_tokens"] == 4 * 16
    for k, v in backend.full_state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)

    real_cfg = JetrlConfig.model_validate({"trainer": {"device": "cpu"}})
    real = execute(make_backend(real_cfg), {"kind": "step", "items": items(4, 20)}, real_cfg)
    assert set(real) <= set(stats)  # everything the service reads from a real step is there
