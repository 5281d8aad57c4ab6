"""Sections several services read: the off-policy schedule, the model, telemetry."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from shared.config.base import Section


class ScheduleConfig(Section):
    """The off-policy contract shared by the controller (admission), rollout and trainer (filtering)."""

    max_staleness: int = Field(
        4,
        ge=0,
        description="Largest allowed (trainer version - oldest token version) of a trained sample. "
        "0 with blocking releases is the synchronous baseline.",
    )
    batch_size: int = Field(8, ge=1, description="Trajectory groups per optimizer step.")
    batch_wait_s: float = Field(
        0.0, ge=0,
        description="The longest a group waits in the trainer's buffer for a batch to fill: when the oldest held "
        "group has waited this long, the trainer trains what it holds as a smaller batch (0 = wait for batch_size). "
        "Where groups with signal are scarce (adaptive sampling, dynamic_filter) a full batch can take minutes "
        "and the trainer idles; this trades batch size for steps. The groups trained short of batch_size are "
        "announced (WeightVersion.short) and the controller's admission bound takes them off, as for a drained "
        "last batch (docs/trainer.md, \"The last batch\"). Not in the last (max_staleness + 1) x publish_every "
        "steps of a run with total_steps: the controller has released what those steps train in full batches.")
    total_steps: int = Field(
        0,
        ge=0,
        description="Length of the run: the trainer stops after this many optimizer steps in the final model's "
        "lineage (a resumed trainer counts from its checkpoint's step), and the controller releases at most "
        "total_steps x batch_size groups not dropped (0 = until the data ends).",
    )


class ModelConfig(Section):
    """The policy model. Either `path` (a HF model dir or hub id) or `tiny` (built from a config)."""

    path: str = Field("", description="Hugging Face model dir or hub id ('' = build the tiny model below).")
    tokenizer: str = Field("", description="Tokenizer dir or hub id ('' = same as path, or the tiny task tokenizer).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights dtype: auto = float32 on CPU, bfloat16 on GPU."
    )
    tiny_layers: int = Field(2, ge=1, description="Tiny model: transformer layers.")
    tiny_hidden: int = Field(64, ge=8, description="Tiny model: hidden size.")
    tiny_heads: int = Field(4, ge=1, description="Tiny model: attention heads.")
    seed: int = Field(0, description="Seed for the tiny model's initial weights.")
    trust_remote_code: bool = Field(False, description="Pass trust_remote_code to transformers.")


class TelemetryConfig(Section):
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")
    log_format: Literal["text", "json"] = Field("text", description="text for terminals, json for log shippers.")
    metrics_port: int = Field(
        0, ge=-1, le=65535, description="Prometheus /metrics port of this process (0 = a free port, -1 = off)."
    )
    metrics_base_port: int = Field(
        9400, ge=0, le=65435,
        description="`jetrl up` / `jetrl demo`: each child's Prometheus port is this plus a fixed offset (trainer +1, "
        "reward +10+i, rollout +20+i; the controller and weight store serve /metrics on their own ports; "
        "docs/launch.md). 0 = free ports. Left at its default and taken (another run on this host), the next free "
        "block of 100 is used and printed; set explicitly and taken, the launcher stops naming the port.",
    )
    metrics_host: str = Field("127.0.0.1", description="Bind address of the metrics endpoint.")
    events_interval_s: float = Field(5.0, gt=0, description="How often a service publishes a metrics Event.")
    wait_deadline_s: float = Field(
        120.0, gt=0, description="A wait that could last for ever (the trainer waiting for groups or retrying a "
        "publish, a rollout worker retrying a weight fetch) sends a `wait_deadline` event with what it waits "
        "for after this long, and again every time as long again: the evidence `jetrl why` reads.",
    )
