"""`sim`: a latency model of a GPU trainer, to benchmark orchestration (asynchronous vs synchronous RL) on
a CPU, the trainer's counterpart of the rollout `sim` engine.

Everything around the optimizer step is real: the NATS intake, staleness filtering, batching,
advantages, events, checkpoints, and publishing to the weight store (the weights are the FSDP backend's
model, normally the tiny one, left unchanged). Only the step itself is replaced by sleeping the time
the step would take on a GPU (trainer.sim):

    step_base_s + s_per_sample * samples + s_per_token * tokens        (times time_scale)

The step's statistics say `simulated: 1`; loss terms are not computed (0.0).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from shared.config.trainer import SimTrainerConfig, TrainerConfig
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.packing import TrainItem


def step_cost_s(o: SimTrainerConfig, samples: int, tokens: int) -> float:
    """Simulated seconds of one optimizer step over `samples` sequences holding `tokens` tokens."""
    return o.step_base_s + o.s_per_sample * samples + o.s_per_token * tokens


class SimBackend(FSDPBackend):
    """The FSDP backend's weights, checkpoints and publishing; its `train_step` is the step-cost model."""

    def train_step(self, items: Sequence[TrainItem], cfg: TrainerConfig, norm_length: int) -> dict:
        """Sleep what the step would take on a GPU (trainer.sim of the backend's config; `cfg` and
        `norm_length`, which shape the real step's loss, are not used)."""
        o = self.cfg.trainer.sim
        t0 = time.perf_counter()
        tokens = sum(it.length for it in items)
        cost = step_cost_s(o, len(items), tokens)
        if o.time_scale > 0:
            time.sleep(cost * o.time_scale)  # runs in the trainer's worker thread (Trainer.on_all_ranks)
        dt = time.perf_counter() - t0
        # The keys of step.train_step's statistics; the loss terms were not computed.
        return {
            "loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0, "capped_frac": 0.0,
            "behav_weight_mean": 1.0, "ratio_mean": 1.0, "adv_abs_mean": 0.0,
            "loss_tokens": sum(it.num_loss_tokens for it in items), "tokens": tokens, "grad_norm": 0.0,
            "lr": self.current_lr(), "micro_batches": 0, "ppo_minibatches": 1, "ppo_epochs": 1, "minibatch_loss": [0.0],
            "minibatch_clip_frac": [0.0], "step_time_s": dt,
            "tokens_per_s": tokens / dt if dt > 0 else 0.0, "simulated": 1, "simulated_cost_s": cost,
            "timings": {},  # no forward / backward / optimizer: the trainer charges the sleep to train_other
        }
