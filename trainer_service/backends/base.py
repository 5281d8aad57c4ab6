"""The base class every training backend derives from (TrainBackend: the interface the step and the
service call, and what the fsdp and megatron backends share: the optimizer and LR schedule, gradient
clipping, the step, DCP checkpoint saving), and the pieces they share besides (distributed setup, token
logprobs from logits, the collectives and the broadcast of driver commands)."""

from __future__ import annotations

import abc
import contextlib
import datetime
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from shared.config import JetrlConfig, TrainerConfig
from trainer_service import checkpoint, step
from trainer_service.logprobs import token_logprobs  # noqa: F401  (the backends' shared helper)
from trainer_service.optim import make_optimizer
from trainer_service.packing import PackedBatch, TrainItem


def tied_output_keys(hf_config: Any, keys) -> set[str]:
    """The output-embedding keys (`lm_head.weight`) a published state dict leaves out because the model
    ties them to its input embedding, as transformers' own save does: every loader (from_pretrained, the
    local engine, vLLM, SGLang) re-ties them. SmolLM2-135M: 113 MB of the 651 MB a version would be."""
    keys = list(keys)
    if not getattr(hf_config, "tie_word_embeddings", False) or not any(k.endswith("embed_tokens.weight") for k in keys):
        return set()
    return {k for k in keys if k.endswith("lm_head.weight")}


def pick_device(choice: str) -> torch.device:
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device: cuda requested but torch sees no GPU")
    if choice == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def init_distributed(device: torch.device) -> tuple[int, int]:
    """Join the torchrun process group when launched by torchrun (gloo on CPU, NCCL on GPU)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # Long timeout: ranks > 0 wait in a broadcast while rank 0 waits for trajectories.
        dist.init_process_group(backend, timeout=datetime.timedelta(hours=2))
    return dist.get_rank(), dist.get_world_size()


def exit_rank(code: int) -> None:
    """End a torchrun rank without Python's interpreter shutdown, once its process group is closed.

    A gloo worker thread may still be destroying the last collective's work when the main thread
    finalizes the interpreter; its tensors then decref Python objects, the thread is ended while taking
    the GIL, and the process aborts with "terminate called without an active exception" (read from a core
    dump; seen in ~1 of 15 runs of the 2-node trainer test, whose other node's torchrun then waited 300 s
    at its exit barrier, and in a 2-rank LoRA test). Logs and stdio are flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class DistMixin:
    """Collectives that degrade to identities in a single process."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def _dist(self) -> bool:
        return self.world_size > 1 and dist.is_initialized()

    def _coll_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def all_reduce_max(self, n: int) -> int:
        if not self._dist:
            return n
        t = torch.tensor([n], dtype=torch.int64, device=self._coll_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if not self._dist:
            return t
        x = t.to(self._coll_device())
        dist.all_reduce(x)
        return x.cpu()

    def broadcast(self, obj: Any) -> Any:
        if not self._dist:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, device=self._coll_device())
        return box[0]

    def barrier(self) -> None:
        if self._dist:
            dist.barrier()


class TrainBackend(DistMixin, abc.ABC):
    """A training backend. Its __init__ sets `rank`, `world_size`, `device`, `model` (the trained module;
    possibly wrapped, e.g. in DDP), `tokenizer`, `_hf_config` and `autocast_dtype` (None: no autocast),
    and calls `_init_optimizer`; it implements `forward`, `full_state_dict`, `_dcp_state`,
    `load_checkpoint` and `close`. The rest is here: the step (trainer_service/step.py; the sim backend
    overrides `train_step`), gradient clipping with the optimizer and LR scheduler step, and saving."""

    model: torch.nn.Module
    tokenizer: Any = None
    autocast_dtype: torch.dtype | None = None
    _hf_config: Any = None

    def _init_optimizer(self, params, cfg: JetrlConfig) -> None:
        """trainer.optim's optimizer over `params` and its LR schedule (step.lr_lambda)."""
        t = cfg.trainer
        self.optimizer = make_optimizer(params, t.optim)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, step.lr_lambda(t, cfg.schedule.total_steps))

    # --- compute --------------------------------------------------------------------------------

    def train_step(self, items: Sequence[TrainItem], cfg: TrainerConfig, norm_length: int) -> dict:
        """The update over `items` (`ppo_minibatches` optimizer steps): the shared step
        (trainer_service/step.py:train_step) on this backend; returns its statistics."""
        return step.train_step(self, items, cfg, norm_length)

    @abc.abstractmethod
    def forward(self, m: PackedBatch, which: str = "policy", grad: bool = False,
                entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-position (logprob of target, entropy) of a packed micro-batch, shape [T] each; only the loss
        positions (m.mask > 0) are meaningful (others may be 0). `entropy=False`: the caller does not use
        it (zeros allowed)."""
        raise NotImplementedError

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_and_step(self, max_norm: float) -> float:
        """Clip the global grad norm (0 = off), optimizer + LR scheduler step; returns the norm before clipping."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor
            norm = norm.full_tensor()
        self.optimizer.step()
        self.scheduler.step()
        return float(norm)

    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def scale_lr(self, factor: float) -> None:
        """Multiply the learning rate (the schedule's peak, so the schedule goes on from there) by `factor`."""
        s = self.scheduler
        s.base_lrs = [b * factor for b in s.base_lrs]
        for group, base, fn in zip(self.optimizer.param_groups, s.base_lrs, s.lr_lambdas, strict=True):
            group["lr"] = base * fn(s.last_epoch)

    # --- weights and checkpoints ----------------------------------------------------------------

    def hf_config(self) -> Any:
        return self._hf_config

    @abc.abstractmethod
    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full HF-layout state dict on rank 0 (cpu), None elsewhere. Collective."""
        raise NotImplementedError

    @abc.abstractmethod
    def _dcp_state(self) -> dict:
        """{"model": ..., "optim": ...}: what a DCP checkpoint saves and loads."""
        raise NotImplementedError

    def save_checkpoint(self, path: str, extra: dict) -> None:
        checkpoint.save(path, self._dcp_state(), self.scheduler, extra, self.rank, self.barrier)

    @abc.abstractmethod
    def load_checkpoint(self, path: str) -> dict:
        """Load a checkpoint saved by `save_checkpoint`; returns its `extra`."""
        raise NotImplementedError

    @abc.abstractmethod
    def close(self) -> None:
        raise NotImplementedError
