"""FSDP2 backend: a Hugging Face causal LM sharded with `torch.distributed.fsdp.fully_shard` (one
FSDP unit per decoder layer plus the root), data parallel over ranks. One process without torchrun
trains the plain module (same code path otherwise). gloo on CPU, NCCL on GPU.

With `trainer.lora` the model is a peft LoRA model (trainer_service/lora.py): the base is frozen, the
optimizer holds only the adapter, checkpoints hold only the trainable tensors (DCP with
ignore_frozen_params) and `full_state_dict` returns the adapter alone; the KL reference is the same
model with the adapter switched off.
"""

from __future__ import annotations

import contextlib
import copy
import logging

import torch

from shared.config import JetrlConfig
from shared.model.tinymodel import load_policy
from trainer_service import activations, checkpoint, lora, varlen
from trainer_service.backends.base import TrainBackend, init_distributed, pick_device, tied_output_keys
from trainer_service.logprobs import (
    at_positions,
    head_supports_chunking,
    loss_position_head,
    loss_positions,
    masked_logprobs_from_logits,
)
from trainer_service.packing import PackedBatch

log = logging.getLogger("jetrl.trainer.fsdp")


def _attn_impl(choice: str, device: torch.device, shared_prompts: bool = False) -> str:
    if choice == "varlen":
        return varlen.register()
    if choice != "auto":
        return choice
    if device.type == "cuda" and not shared_prompts:
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            pass
    return varlen.register()


def decoder_layers(model) -> list[torch.nn.Module]:
    inner = lora.unwrap(model)
    inner = getattr(inner, "model", inner)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no .model.layers to shard; FSDP backend supports HF decoder LMs")
    return list(layers)


class FSDPBackend(TrainBackend):
    def __init__(self, cfg: JetrlConfig):
        t = cfg.trainer
        self.cfg = cfg
        self.device = pick_device(t.device)
        self.rank, self.world_size = init_distributed(self.device)
        torch.manual_seed(t.seed)
        dtype = t.dtype if t.dtype != "auto" else ("bfloat16" if self.device.type == "cuda" else "float32")
        self.autocast_dtype = torch.bfloat16 if dtype == "bfloat16" else None
        model, self.tokenizer = load_policy(cfg.model, "cpu")
        model.config._attn_implementation = _attn_impl(t.attn_implementation, self.device, t.shared_prompt_packing)
        # Shared-prompt rows need the varlen attention (it reads the segments); others pack unshared.
        self.shared_prompts = t.shared_prompt_packing and model.config._attn_implementation == varlen.NAME
        if t.shared_prompt_packing and not self.shared_prompts:
            log.info("trainer.shared_prompt_packing: off with attn_implementation %s (needs varlen)",
                     model.config._attn_implementation)
        model.config.use_cache = False
        self._hf_config = copy.deepcopy(model.config)
        model.to(self.device, dtype=torch.float32)  # fp32 master weights; bf16 compute via autocast
        self.lora = t.lora
        if self.lora is not None:
            model = lora.wrap(model, self.lora)
        self.ref = None
        if t.algorithm.kl_coef > 0 and self.lora is None:
            self.ref = copy.deepcopy(model).eval().requires_grad_(False)
        if t.activation_checkpointing is not False:  # auto: switched per micro-batch (trainer_service/activations.py)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self._dist:
            from torch.distributed.fsdp import fully_shard

            for m in [model] + ([self.ref] if self.ref is not None else []):
                for layer in decoder_layers(m):
                    fully_shard(layer)
                fully_shard(m)
        self.model = model
        self._ckpt_layers = activations.checkpointing_layers(model)
        self._saved_per_token = activations.saved_bytes_per_token(self._hf_config)
        self.checkpointed_micro_batches = 0  # (activation_checkpointing auto) micro-batches run checkpointed
        self._chunkable = head_supports_chunking(model)
        self._init_optimizer((p for p in model.parameters() if p.requires_grad), cfg)

    # --- compute --------------------------------------------------------------------------------

    def forward(self, m: PackedBatch, which: str = "policy", grad: bool = False, entropy: bool = True):
        """(logprob, entropy) [T], computed at the loss positions only: with trainer.logprob_chunk_tokens > 0
        the head projects just those positions, in chunks (trainer_service/logprobs.py). With LoRA the
        reference is the policy with its adapter switched off."""
        model = self.model if which == "policy" or self.lora is not None else self.ref
        t = self.cfg.trainer
        mode = "grad" if grad and t.algorithm.entropy_coef > 0 else ("stat" if entropy else "none")
        ctx = contextlib.nullcontext() if grad else torch.no_grad()
        base_only = (self.model.disable_adapter() if which != "policy" and self.lora is not None
                     else contextlib.nullcontext())
        model.train(grad)
        # attention_mask=None + restarting position_ids -> block-diagonal causal attention (sdpa/eager
        # build the mask from position_ids); varlen/flash kernels read the sequence boundaries.
        longest = max(m.lengths)
        kw = dict(input_ids=m.input_ids, position_ids=m.position_ids, use_cache=False, cu_seq_lens_q=m.cu_seqlens,
                  cu_seq_lens_k=m.cu_seqlens, max_length_q=longest, max_length_k=longest)
        if m.segments is not None:
            if model.config._attn_implementation != varlen.NAME:
                raise ValueError("a shared-prompt micro-batch needs trainer.attn_implementation varlen")
            kw["jetrl_segments"] = m.segments
        ckpt = grad and activations.wants_checkpointing(t.activation_checkpointing, m.num_tokens,
                                                        self._saved_per_token, t.activation_memory_gb)
        self.checkpointed_micro_batches += ckpt
        ckpt_ctx = activations.checkpointing(self._ckpt_layers, ckpt)
        if t.logprob_chunk_tokens > 0 and self._chunkable:
            pos = loss_positions(m.mask)
            head = loss_position_head(model, pos, m.targets, t.logprob_chunk_tokens, mode,
                                      self.cfg.rollout.sampling.allowed_token_ids)
            with ctx, ckpt_ctx, self._autocast(), base_only, head as box:
                model(**kw)
            n = m.num_tokens
            return at_positions(box["logp"], pos, n), at_positions(box["entropy"], pos, n)
        with ctx, ckpt_ctx, self._autocast(), base_only:
            out = model(**kw)
            return masked_logprobs_from_logits(out.logits[0], m.targets, m.mask, mode,
                                               self.cfg.rollout.sampling.allowed_token_ids)

    # --- weights and checkpoints ----------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full HF state dict on rank 0; with LoRA, the adapter's tensors only (peft's saved names)."""
        trainable_only = self.lora is not None
        if self._dist:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            sd = get_model_state_dict(self.model, options=StateDictOptions(
                full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only))
            if self.rank != 0:
                return None
        else:
            own = self.model.state_dict()
            skip = set() if trainable_only else tied_output_keys(self._hf_config, own)
            sd = {k: v.detach().to("cpu", copy=True) for k, v in own.items()
                  if k not in skip and (not trainable_only or "lora_" in k or "modules_to_save" in k)}
        if trainable_only:
            return lora.adapter_state_dict(self.model, sd)
        for k in tied_output_keys(self._hf_config, sd):
            del sd[k]
        return sd

    def _sd_options(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        # LoRA: only the trainable tensors are saved, so loading leaves the (frozen) base as built.
        lora_run = self.lora is not None
        return StateDictOptions(ignore_frozen_params=lora_run, strict=not lora_run)

    def _dcp_state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.model, self.optimizer, options=self._sd_options())
        return {"model": msd, "optim": osd}

    def load_checkpoint(self, path: str) -> dict:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._dcp_state()
        extra = checkpoint.load(path, state, self.scheduler, self.rank)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=self._sd_options())
        return extra

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
