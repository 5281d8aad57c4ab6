"""Trainer: algorithm, optimisation, execution, backend, checkpoints and publishing.

Formulas behind the algorithm options are in docs/algorithms.md; the intake and recovery design in
docs/trainer.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from shared.config.base import Section


class AlgorithmConfig(Section):
    """The policy-gradient objective (decoupled PPO by default), its behaviour correction and advantages."""

    adv_estimator: Literal["grpo", "grpo_nostd", "rloo", "reinforce"] = Field(
        "grpo",
        description="Advantage of a sample from its group's rewards: grpo = (r - mean) / (std + eps); "
        "grpo_nostd = r - mean (Dr. GRPO); rloo = r - mean of the other samples; reinforce = r - batch mean.",
    )
    adv_eps: float = Field(1e-6, gt=0, description="Added to the group std before dividing (grpo).")
    eps_clip: float = Field(0.2, gt=0, description="PPO clip: ratio pi_theta/pi_prox is kept within [1-eps, 1+eps_high].")
    eps_clip_high: float | None = Field(
        None, gt=0, description="Upper clip (DAPO clip-higher); None = same as eps_clip."
    )
    objective: Literal["ppo", "gspo", "cispo", "iw_reinforce", "reinforce"] = Field(
        "ppo",
        description="Policy loss per token (r = pi_theta/pi_prox, w = the behaviour correction): ppo = w x PPO's "
        "clipped surrogate (decoupled PPO, AReaL); gspo = the clip on the sequence's geometric-mean ratio "
        "(GSPO; its paper clips at ~3e-4/4e-4, set eps_clip/eps_clip_high); cispo = -w sg[clip(r)] A log pi "
        "(CISPO, MiniMax-M1; clip bounds from eps_clip/eps_clip_high); iw_reinforce = -w A r (importance-"
        "weighted REINFORCE, no clip); reinforce = -A log pi (no correction at all; behaviour weight ignored).",
    )
    behav_imp_weight_cap: float | None = Field(
        5.0,
        gt=0,
        description="Upper bound of the behaviour correction on pi_prox/pi_behav (see behav_imp_weight_mode); "
        "None = unbounded importance weights (not allowed for geo_mask / icepop).",
    )
    behav_imp_weight_floor: float | None = Field(
        None,
        gt=0,
        description="Lower bound of the band used by geo_mask and icepop (tokens/sequences below it are masked); "
        "None = 1 / behav_imp_weight_cap.",
    )
    behav_imp_weight_mode: Literal["none", "mask", "truncate", "seq_truncate", "geo_mask", "icepop"] = Field(
        "mask",
        description="Behaviour correction w from rho = pi_prox/pi_behav per token: none = 1; mask = rho, 0 above "
        "the cap (masked IS, AReaL); truncate = min(rho, cap) (TIS); seq_truncate = min(product of the "
        "sequence's rho, cap) on all its tokens (sequence-level IS, verl rollout_corr); geo_mask = 1, or 0 for "
        "the whole sequence when the geometric mean of its rho leaves [floor, cap] (verl rollout_corr; typical "
        "band 0.999-1.001); icepop = rho, 0 where rho leaves [floor, cap] (IcePop, Ring-1T; 0.5-5).",
    )
    decoupled: bool = Field(
        True,
        description="Decoupled PPO: proximal logprobs recomputed by the trainer before the update. False = "
        "standard PPO with the behaviour logprobs as the old policy (no recompute pass).",
    )
    ppo_minibatches: int = Field(
        1,
        ge=1,
        description="Optimizer steps per trained batch (AReaL's ppo_n_minibatches): the batch is split into this "
        "many minibatches of consecutive samples, one optimizer step each. 1 = one step and no proximal pass "
        "(pi_prox is the training forward's own logprobs, the PPO ratio is 1 and the clip never acts). k > 1 = "
        "one extra no-grad forward over the batch before the first minibatch computes pi_prox, so the clip "
        "(eps_clip / eps_clip_high) acts from the second minibatch on; each minibatch's loss is normalised "
        "over its own tokens. Capped at the number of samples.",
    )
    ppo_epochs: int = Field(
        1,
        ge=1,
        description="Passes over each trained batch (the GRPO paper's mu, TRL's num_iterations, verl's ppo_epochs): "
        "every pass takes one optimizer step per minibatch, so a batch makes ppo_epochs x ppo_minibatches steps, "
        "all against the one pi_prox from before the first (the clip bounds how far the passes move the policy "
        "from it). 1 = one pass. > 1 reuses each batch: worth it where groups with a reward spread are scarce "
        "and the trainer waits for them (docs/algorithms.md, \"PPO epochs\"); it runs the proximal pass.",
    )
    normalisation: Literal["token", "sequence", "fixed"] = Field(
        "token",
        description="Loss normalisation: token = sum over all loss tokens / their count (DAPO); sequence = "
        "mean over each sequence's tokens, then over sequences (GRPO); fixed = sum / (sequences x "
        "norm_length) (Dr. GRPO).",
    )
    norm_length: int = Field(
        0, ge=0, description="fixed normalisation: the constant length (0 = rollout.sampling.max_new_tokens)."
    )
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL penalty to the reference (initial) model; 0 = off.")
    entropy_coef: float = Field(0.0, ge=0, description="Weight of an entropy bonus (0 = only measured, not optimised).")
    dynamic_filter: bool = Field(
        False, description="Drop groups whose rewards are all equal (zero advantage; DAPO dynamic sampling)."
    )
    dynamic_filter_eps: float = Field(1e-6, ge=0, description="Rewards within this of each other count as equal.")

    @model_validator(mode="after")
    def _check_band(self) -> AlgorithmConfig:
        mode, cap, floor = self.behav_imp_weight_mode, self.behav_imp_weight_cap, self.behav_imp_weight_floor
        if mode in ("geo_mask", "icepop") and cap is None:
            raise ValueError(f"trainer.algorithm.behav_imp_weight_cap: {mode} needs an upper bound, got None")
        if cap is not None and floor is not None and floor >= cap:
            raise ValueError(f"trainer.algorithm.behav_imp_weight_floor: {floor} must be below "
                             f"behav_imp_weight_cap ({cap})")
        return self


class OptimConfig(Section):
    """AdamW, gradient clipping and the learning-rate schedule."""

    name: Literal["adamw", "adamw_8bit"] = Field(
        "adamw",
        description="adamw = torch AdamW (float32 moments); adamw_8bit = bitsandbytes' AdamW8bit (block-wise "
        "8-bit moments: a quarter of the optimizer memory, slower steps on CPU; the `bnb` extra). "
        "trainer_service/optim.py.")
    lr: float = Field(1e-3, gt=0, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    grad_clip: float = Field(1.0, ge=0, description="Clip the global gradient norm to this (0 = off).")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="After warmup: constant, linear decay to min_lr_ratio, or cosine decay."
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warmup from 0 to lr over this many optimizer steps.")
    decay_steps: int = Field(
        0, ge=0, description="Optimizer steps of linear/cosine decay after warmup (0 = schedule.total_steps x "
        "algorithm.ppo_minibatches x algorithm.ppo_epochs, or 1000 if total_steps is 0)."
    )
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Floor of the decay as a fraction of lr.")


class MegatronConfig(Section):
    """Megatron-Core backend (GPU only)."""

    tensor_parallel: int = Field(1, ge=1, description="Tensor-parallel size.")
    pipeline_parallel: int = Field(1, ge=1, description="Pipeline-parallel size (only 1 is supported).")
    use_te: bool = Field(
        False, description="Transformer Engine layer spec (fused layernorm in linear_qkv / linear_fc1) if installed."
    )


class LoraConfig(Section):
    """LoRA adapters (the `peft` library) on the policy: only the adapter (and `modules_to_save`) trains,
    the optimizer and checkpoints hold only those, and every published version is an adapter on the
    base model `model` names (docs/trainer.md, LoRA; docs/protocol.md, weight versions)."""

    rank: int = Field(8, ge=1, le=1024, description="LoRA rank r of each adapter (A: r x in, B: out x r).")
    alpha: float = Field(16.0, gt=0, description="LoRA alpha: the adapter's update is scaled by alpha / rank.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input during training.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
        description="Linear layers that get an adapter, by module-name suffix (peft target_modules); the "
        "default is every attention and MLP projection of Llama/Qwen-style decoders.",
    )
    modules_to_save: list[str] = Field(
        default_factory=list,
        description="Modules trained in full beside the adapters and shipped with them (e.g. lm_head); "
        "their weights go into every published version, so keep this short.",
    )

    @model_validator(mode="after")
    def _check_names(self) -> LoraConfig:
        for field in ("target_modules", "modules_to_save"):
            for name in getattr(self, field):
                if not name or not name.replace("_", "").replace(".", "").isalnum():
                    raise ValueError(f"trainer.lora.{field}: {name!r} is not a module name")
        both = set(self.target_modules) & set(self.modules_to_save)
        if both:
            raise ValueError(f"trainer.lora.modules_to_save: {sorted(both)} are also in target_modules")
        return self


class SimTrainerConfig(Section):
    """The `sim` backend: a latency model of a GPU trainer (trainer_service/backends/sim.py), for benchmarking
    orchestration on a CPU. The weights (the tiny model) are real and are published and checkpointed as
    usual; only the optimizer step is replaced by a sleep of

        step_base_s + s_per_sample * samples + s_per_token * tokens   (times time_scale).
    """

    step_base_s: float = Field(0.5, ge=0, description="Fixed cost of one optimizer step (s).")
    s_per_sample: float = Field(0.0, ge=0, description="Cost per trained sample (s).")
    s_per_token: float = Field(0.0, ge=0, description="Cost per trained token, prompt and completion (s).")
    time_scale: float = Field(1.0, ge=0, description="Real seconds slept per simulated second (0 = no sleep).")


class GuardConfig(Section):
    """The collapse guard (trainer_service/guard.py; docs/trainer.md, "The collapse guard"): each step's
    statistics against the median of the last `window` steps. A check that fails `consecutive` steps in a row
    trips it: a `guard_tripped` event with the evidence, then `action`."""

    enabled: bool = Field(False, description="Watch every step (off by default).")
    window: int = Field(20, ge=3, description="Steps of history each check compares against (their median).")
    min_history: int = Field(5, ge=2, description="Steps seen before any check can fail (the first steps move fast).")
    consecutive: int = Field(2, ge=1, description="A check must fail this many steps in a row to trip the guard.")
    entropy_ratio: float = Field(
        0.25, ge=0, le=1, description="Trip when the policy's mean entropy falls below this fraction of its median "
        "(0 = never): a policy collapsing onto one answer.",
    )
    max_capped_frac: float = Field(
        0.5, ge=0, le=1, description="Trip when more than this share of tokens had their behaviour importance weight "
        "capped or masked (trainer.algorithm.behav_imp_weight_cap / the correction's mask): the policy has moved "
        "too far from the one that generated its data (1 = never).",
    )
    max_clip_frac: float = Field(0.6, ge=0, le=1, description="Trip when the PPO clip fraction exceeds this (1 = never).")
    grad_norm_ratio: float = Field(
        10.0, ge=0, description="Trip when the gradient norm exceeds this many times its median (0 = never).",
    )
    reward_drop: float = Field(
        0.0, ge=0, description="Trip when the batch's mean reward falls more than this below its median (in reward "
        "units; 0 = never: rewards are noisy and their scale is the task's).",
    )
    action: Literal["warn", "pause", "rollback"] = Field(
        "warn", description="warn: the event only. pause: also stop releasing new prompts (the controller pauses "
        "the run; resume it with POST /v1/runs/{run}/resume). rollback: load the newest checkpoint from before the "
        "failing streak, publish its weights as the next version (workers return to them), discard the groups "
        "trained since (ledger: filtered, with the reason) and the groups generated by the discarded versions, "
        "scale the learning rate by `lr_factor`, and go on; with no such checkpoint it pauses instead.",
    )
    lr_factor: float = Field(0.5, gt=0, le=1, description="rollback: the learning rate is multiplied by this.")


class TrainerConfig(Section):
    backend: Literal["fsdp", "megatron", "sim"] = Field(
        "fsdp",
        description="Training backend: fsdp (FSDP2, CPU or GPU), megatron (Megatron-Core, GPU), sim (a step-cost "
        "model on the tiny model's real weights, for benchmarks; see trainer.sim).",
    )
    nproc: int = Field(1, ge=1, description="Processes (torchrun --nproc-per-node); >1 re-launches under torchrun.")
    nnodes: int = Field(
        1, ge=1,
        description="Hosts the trainer spans (torchrun --nnodes). >1: run `jetrl trainer` on every node with its "
        "node_rank and the same master_addr; world size = nnodes x nproc (docs/trainer.md, multi-node).",
    )
    node_rank: int = Field(0, ge=0, description="This host's rank among the trainer's nnodes (0 publishes weights).")
    master_addr: str = Field(
        "", description="Rendezvous host every node reaches (torchrun --rdzv-endpoint host): node 0's address. "
        "Required when nnodes > 1."
    )
    master_port: int = Field(29400, ge=1, le=65535, description="Rendezvous port on master_addr (torchrun c10d).")
    rdzv_backend: Literal["static", "c10d"] = Field(
        "static",
        description="Multi-node rendezvous: static = node_rank fixes the ranks (node 0 hosts the store and global "
        "rank 0, which publishes); c10d = torchrun's elastic rendezvous (ranks in order of arrival, node_rank unused).",
    )
    rdzv_id: str = Field("", description="c10d rendezvous id shared by the nodes of one trainer ('' = the run id).")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available, else cpu.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Compute dtype: auto = float32 on CPU, bfloat16 (mixed precision) on GPU."
    )
    lr: float | None = Field(None, gt=0, description="Shortcut for optim.lr (kept for older configs).")
    optim: OptimConfig = Field(default_factory=OptimConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    megatron: MegatronConfig = Field(default_factory=MegatronConfig)
    sim: SimTrainerConfig = Field(default_factory=SimTrainerConfig)
    lora: LoraConfig | None = Field(
        None,
        description="Train LoRA adapters instead of the full model (fsdp backend only; see trainer.lora.*). "
        "None = full-model training.",
    )
    micro_batch_tokens: int = Field(
        4096, ge=16, description="Token budget of one packed micro-batch (sequences are concatenated, no padding)."
    )
    logprob_chunk_tokens: int = Field(
        1024,
        ge=0,
        description="Log-probabilities are computed only at loss positions (generated tokens); the output head "
        "projects those positions this many at a time (logits recomputed per chunk in backward), so no "
        "[tokens x vocabulary] tensor of a micro-batch exists. 0 = one full-logits pass, then the loss "
        "positions (more memory; models whose logits are not the head's plain linear map always use it).",
    )
    shared_prompt_packing: bool = Field(
        True,
        description="Pack each prompt group's common prompt once per micro-batch: every completion attends to it "
        "and to itself (block mask, position ids continuing after the prompt), so the prompt's forward and "
        "backward run once instead of group_size times; the loss and gradients equal unshared packing. Needs "
        "the varlen attention (the CPU default; `auto` picks it over flash-attention when this is on); with "
        "sdpa/eager/flash_attention_2 or the megatron backend sequences are packed unshared.",
    )
    activation_checkpointing: bool | Literal["auto"] = Field(
        "auto",
        description="Recompute activations in backward (saves memory, costs a second forward per layer): true, "
        "false, or auto = for each micro-batch whose estimated saved activations are over "
        "trainer.activation_memory_gb (long samples), not for the others (trainer_service/activations.py). The "
        "megatron backend recomputes with true only.",
    )
    activation_memory_gb: float = Field(
        2.0, gt=0,
        description="activation_checkpointing auto: a micro-batch whose forward would save more than this many GB "
        "for backward (estimated from the model's shape: layers x (10 x hidden + 4 x intermediate + 2 x key/value "
        "width) float32s per token, 1.47 MB for SmolLM2-135M, so ~1,360 tokens) runs with activation checkpointing.",
    )
    release_memory: bool = Field(
        False,
        description="After each step, hand the memory the step freed back to the OS (glibc malloc_trim; "
        "trainer_service/memory.py). Lowers a CPU trainer's resident set between steps and, with "
        "activation_checkpointing, its peak; each step then faults those pages in again (slower).")
    attn_implementation: Literal["auto", "varlen", "sdpa", "eager", "flash_attention_2"] = Field(
        "auto",
        description="Attention over packed sequences: auto = flash_attention_2 on GPU when installed, else "
        "varlen (causal SDPA per packed sequence, cost sum L^2); sdpa/eager = one block-diagonal mask built "
        "from position_ids (cost T^2).",
    )
    checkpoint_dir: str = Field("jetrl-checkpoints", description="Where checkpoints are written (one dir per run).")
    checkpoint_every: int = Field(10, ge=1, description="Checkpoint every N optimizer steps.")
    keep_checkpoints: int = Field(2, ge=1, description="Keep the newest N checkpoints.")
    publish_every: int = Field(1, ge=1, description="Publish weights every N optimizer steps.")
    publish_overlap: bool = Field(
        True,
        description="Write and upload version v while the next step trains (the state dict is a copy taken "
        "right after step v). The next publish, a checkpoint and shutdown wait for it, so versions stay in "
        "order and at most one copy is in flight. false = the trainer waits for each publish before it "
        "trains again (SmolLM2-135M: ~5 s per step on 2 cores; docs/trainer.md).",
    )
    publish_snapshot: Literal["memory", "disk"] = Field(
        "memory",
        description="What the trainer keeps of version v once it trains on: memory = an in-memory copy of the "
        "weights, written to files in the background and dropped once written (the next step starts at "
        "once); disk = the files are written before the next step starts and no copy outlives that (the "
        "write, ~0.5 s for SmolLM2-135M, is on the step's path; saves the copy's memory in the next step). "
        "Either way the upload overlaps the next step with publish_overlap.",
    )
    publish_dtype: Literal["as_trained", "bfloat16", "float16", "float32"] = Field(
        "as_trained",
        description="The dtype floating-point weights are published in: as_trained = the trainer's own (fp32 "
        "on CPU); bfloat16 halves every version's bytes and, since most bf16 values do not change in one RL "
        "step, makes its delta small (weights.delta; docs/weight_store.md). The rollout engines then sample "
        "from the rounded weights, which is the behaviour policy the decoupled objective corrects for. A "
        "LoRA adapter is published as trained.",
    )
    publisher: Literal["store", "directory"] = Field(
        "store",
        description="store = weight_store client + KV announcement; directory = write versions to publish_dir "
        "and announce them in the KV with a file:// manifest url (trainer tests without a weight store; "
        "rollout workers fetch through the weight store and cannot load these).",
    )
    publish_dir: str = Field("jetrl-published", description="Directory of the `directory` publisher.")
    max_buffered_groups: int = Field(
        0, ge=0, description="Intake holds at most this many groups waiting for a batch (0 = 4 x batch_size)."
    )
    seed: int = Field(0, description="Seed of the trainer's RNG (dropout, sampling in tests).")
    guard: GuardConfig = Field(default_factory=GuardConfig, description="The collapse guard (off by default).")
    no_signal_groups: int = Field(
        0, ge=0,
        description="Say so (a `no_signal` event, the dashboard, `jetrl status`) when this many groups in a row "
        "reached the trainer without a reward spread, trained on a zero advantage or filtered (trainer_service/"
        "signal_watch.py); a group with a spread ends it (a second event, active false). 0 = 3 x schedule.batch_size, "
        "or 10 x with rollout.adaptive on (most of its groups are filtered by design).",
    )
    dedup_window: int = Field(
        100_000, ge=1, description="Group ids remembered (and checkpointed) to drop re-published duplicates."
    )
    ack_wait_s: float = Field(60.0, gt=0, description="Ack wait of the trajectory consumer.")

    @model_validator(mode="after")
    def _check_nodes(self) -> TrainerConfig:
        if self.nnodes > 1 and not self.master_addr:
            raise ValueError("trainer.master_addr: required when trainer.nnodes > 1 (node 0's address)")
        if self.node_rank >= self.nnodes:
            raise ValueError(f"trainer.node_rank: {self.node_rank} must be below trainer.nnodes ({self.nnodes})")
        return self

    @model_validator(mode="after")
    def _check_lora(self) -> TrainerConfig:
        if self.lora is not None and self.backend != "fsdp":
            raise ValueError(f"trainer.lora: LoRA is supported by the fsdp backend only, not trainer.backend "
                             f"{self.backend!r} (docs/trainer.md, LoRA)")
        return self

    @model_validator(mode="after")
    def _apply_lr_shortcut(self) -> TrainerConfig:
        if self.lr is not None and self.optim.lr != self.lr:
            self.optim.lr = self.lr
        if self.megatron.pipeline_parallel != 1:
            raise ValueError("trainer.megatron.pipeline_parallel: only 1 is supported")
        return self
