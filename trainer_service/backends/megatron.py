"""Megatron-Core backend (GPU only): the policy as a megatron.core GPTModel built from the Hugging Face
config, weights converted HF -> Megatron at start and Megatron -> HF for every published version
(megatron_convert.py), data parallel with torch DDP over tensor-parallel-1 replicas.

Packing: with Transformer Engine (`trainer.megatron.use_te`) a micro-batch is one packed row in THD
format (PackedSeqParams with cu_seqlens: varlen attention, RoPE restarting per sequence). Megatron's
local (non-TE) spec has no varlen attention and applies RoPE by row position, so without TE each
sequence of the micro-batch runs as its own row of batch size 1: still no padding compute, fewer
FLOPs per kernel launch. What is tested where: docs/trainer.md.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os

import torch
import torch.distributed as dist

from shared.config import JetrlConfig
from shared.model.tinymodel import load_policy
from shared.runtime.natsd import free_port
from trainer_service import checkpoint
from trainer_service.backends.base import TrainBackend
from trainer_service.backends.megatron_convert import (
    LayoutSpec,
    hf_to_megatron,
    megatron_to_hf,
    rope_base,
    transformer_config_kwargs,
)
from trainer_service.logprobs import masked_logprobs_from_logits
from trainer_service.packing import PackedBatch

log = logging.getLogger("jetrl.trainer.megatron")


def _te_available() -> bool:
    try:
        import transformer_engine  # noqa: F401

        return True
    except ImportError:
        return False


class MegatronBackend(TrainBackend):
    def __init__(self, cfg: JetrlConfig):
        t = cfg.trainer
        if not torch.cuda.is_available():
            raise RuntimeError("trainer.backend=megatron needs a CUDA GPU (Megatron-Core's forward is CUDA-only); "
                               "use trainer.backend=fsdp on CPU")
        if t.megatron.tensor_parallel != 1:
            raise ValueError("trainer.megatron.tensor_parallel: only 1 is supported (data parallel over ranks)")
        try:
            from megatron.core import parallel_state, tensor_parallel
            from megatron.core.models.gpt import GPTModel
            from megatron.core.transformer import TransformerConfig
        except ImportError as exc:
            raise RuntimeError("trainer.backend=megatron needs megatron-core: pip install megatron-core") from exc
        self.cfg = cfg
        if "RANK" not in os.environ:  # a single process: Megatron still needs a process group
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=str(free_port()))
        self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(self.device)
        if not dist.is_initialized():
            import datetime

            dist.init_process_group("nccl", timeout=datetime.timedelta(hours=2))
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
        tensor_parallel.model_parallel_cuda_manual_seed(t.seed)
        torch.manual_seed(t.seed)

        hf, self.tokenizer = load_policy(cfg.model, "cpu")
        self._hf_config = copy.deepcopy(hf.config)
        c = hf.config
        self.use_te = t.megatron.use_te and _te_available()
        if t.megatron.use_te and not self.use_te:
            log.warning("trainer.megatron.use_te: transformer_engine is not installed; using the local spec")
        self.spec = LayoutSpec.from_hf(c, te=self.use_te)
        kw = transformer_config_kwargs(c)
        if t.activation_checkpointing is True:  # auto: the fsdp backend's per-micro-batch choice only
            kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
        dtype = t.dtype if t.dtype != "auto" else "bfloat16"
        self.autocast_dtype = torch.bfloat16 if dtype == "bfloat16" else None
        tc = TransformerConfig(**kw)
        if self.use_te:
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

            layer_spec = get_gpt_layer_with_transformer_engine_spec()
        else:
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

            layer_spec = get_gpt_layer_local_spec(normalization="RMSNorm")

        def build():
            m = GPTModel(tc, layer_spec, vocab_size=c.vocab_size, max_sequence_length=c.max_position_embeddings,
                         position_embedding_type="rope", rotary_base=int(rope_base(c)),
                         share_embeddings_and_output_weights=self.spec.tied)
            missing, unexpected = m.load_state_dict(hf_to_megatron(hf.state_dict(), self.spec), strict=False)
            missing = [k for k in missing if not k.endswith("_extra_state")]
            if missing or unexpected:
                raise RuntimeError(f"HF -> Megatron conversion mismatch: missing {missing[:5]}, "
                                   f"unexpected {unexpected[:5]}")
            return m.to(self.device)

        self.core = build()
        self.ref = build().eval().requires_grad_(False) if t.algorithm.kl_coef > 0 else None
        self.model = self.core
        if self.world_size > 1:
            self.model = torch.nn.parallel.DistributedDataParallel(self.core, device_ids=[self.device.index])
        self._init_optimizer(self.core.parameters(), cfg)

    def _logits(self, model, m: PackedBatch) -> torch.Tensor:
        if self.use_te:
            from megatron.core.packed_seq_params import PackedSeqParams

            cu = m.cu_seqlens.to(self.device, torch.int32)
            longest = int(max(m.lengths))
            p = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                                max_seqlen_kv=longest)
            return model(m.input_ids, m.position_ids, None, packed_seq_params=p)[0]
        outs, start = [], 0
        for n in m.lengths:
            ids = m.input_ids[:, start:start + n]
            outs.append(model(ids, m.position_ids[:, start:start + n], None)[0])
            start += n
        return torch.cat(outs)

    def forward(self, m: PackedBatch, which: str = "policy", grad: bool = False, entropy: bool = True):
        model = self.model if which == "policy" else self.ref
        model.train(grad)
        ctx = contextlib.nullcontext() if grad else torch.no_grad()
        with ctx, self._autocast():
            logits = self._logits(model, m)
        mode = "grad" if grad and self.cfg.trainer.algorithm.entropy_coef > 0 else ("stat" if entropy else "none")
        return masked_logprobs_from_logits(logits, m.targets, m.mask, mode,
                                           self.cfg.rollout.sampling.allowed_token_ids)

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        if self.rank != 0:
            return None
        sd = {k: v for k, v in self.core.state_dict().items() if not k.endswith("_extra_state")}
        return {k: v.detach().float().cpu() for k, v in megatron_to_hf(sd, self.spec).items()}

    def _dcp_state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.core, self.optimizer)
        return {"model": {k: v for k, v in msd.items() if not k.endswith("_extra_state")}, "optim": osd}

    def load_checkpoint(self, path: str) -> dict:
        state = self._dcp_state()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        extra = checkpoint.load(path, state, self.scheduler, self.rank)
        set_state_dict(self.core, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(strict=False))
        return extra

    def close(self) -> None:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()
