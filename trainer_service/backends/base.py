"""The interface every training backend implements, and the pieces they share (distributed setup,
token logprobs from logits, broadcast of driver commands)."""

from __future__ import annotations

import datetime
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist

from shared.config import TrainerConfig
from trainer_service.logprobs import token_logprobs  # noqa: F401  (the backends' shared helper)
from trainer_service.packing import PackedBatch, TrainItem


class TrainBackend(Protocol):
    rank: int
    world_size: int
    device: torch.device

    def forward(self, m: PackedBatch, which: str = "policy", grad: bool = False,
                entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-position (logprob of target, entropy) of a packed micro-batch, shape [T] each; only the loss
        positions (m.mask > 0) are meaningful (others may be 0). `entropy=False`: the caller does not use
        it (zeros allowed)."""

    def zero_grad(self) -> None: ...
    def backward(self, loss: torch.Tensor) -> None: ...
    def clip_and_step(self, max_norm: float) -> float:
        """Clip the global grad norm (0 = off), optimizer + LR scheduler step; returns the norm before clipping."""

    def current_lr(self) -> float: ...
    def train_step(self, items: Sequence[TrainItem], cfg: TrainerConfig, norm_length: int) -> dict:
        """One optimizer step over `items`; returns the step's statistics (step.train_step's keys)."""

    def all_reduce_max(self, n: int) -> int: ...
    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor: ...
    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full HF-layout state dict on rank 0 (cpu), None elsewhere. Collective."""

    def hf_config(self) -> Any: ...
    def save_checkpoint(self, path: str, extra: dict) -> None: ...
    def load_checkpoint(self, path: str) -> dict: ...
    def close(self) -> None: ...


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
