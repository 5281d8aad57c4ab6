"""Inference engines of a rollout worker: `rollout.local`, `rollout.vllm`, `rollout.sglang`, `rollout.sim`.

Which one runs is `rollout.engine`; docs/engines.md explains each option.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import Field

from shared.config.base import Section

DEFAULT_VLLM_VENV = os.path.join(os.path.expanduser("~"), ".cache", "jetrl", "vllm-cpu-venv")


class LocalEngineConfig(Section):
    """torch + transformers in this process, continuous batching (rollout_service/engines/local.py)."""

    max_batch: int = Field(
        32, ge=1, description="Most sequences decoding together; more requests wait in a queue."
    )
    max_prefill_batch: int = Field(16, ge=1, description="Most new requests prefilled together in one step.")
    share_prefill: bool = Field(
        True,
        description="Prefill each distinct token list of a prefill batch once and give every sequence with "
        "that list a copy of its KV rows: a group's samples share their prompt (8 samples: 1 prompt "
        "forward instead of 8). false = one prefill row per sequence.",
    )
    recompute_kv_on_swap: bool = Field(
        True,
        description="After a weight swap, rebuild in-flight KV caches from their tokens under the new weights "
        "(false = keep the stale cache, cheaper but mixes two policies inside one context).",
    )
    torch_threads: int = Field(
        0, ge=0, description="torch.set_num_threads for the engine (0 = torch's default)."
    )


def _connection_retries() -> Any:
    return Field(
        2, ge=0, le=10,
        description="A generate request whose connection failed (refused, reset, or closed without an answer; "
        "not a time-out) is aborted on the server and sent again, up to this many times, 0.5 s x attempt "
        "apart. A server this worker started and that exited is not retried (the worker stops).",
    )


class VllmEngineConfig(Section):
    """Client of a vLLM OpenAI-compatible server (rollout_service/engines/vllm.py)."""

    url: str = Field(
        "", description="Server base URL, e.g. http://127.0.0.1:8000 ('' = start one, see start_server)."
    )
    model: str = Field("", description="Model name sent in requests ('' = the first one /v1/models lists).")
    start_server: bool = Field(
        False, description="Start a vLLM server subprocess for model.path (needs the vllm venv, see python)."
    )
    python: str = Field(
        os.path.join(DEFAULT_VLLM_VENV, "bin", "python"),
        description="Python of the venv holding vllm / vllm-cpu, used when start_server is true.",
    )
    port: int = Field(0, ge=0, le=65535, description="Port of a started server (0 = a free one).")
    max_model_len: int = Field(256, ge=16, description="--max-model-len of a started server.")
    extra_args: list[str] = Field(
        default_factory=list, description="More command-line arguments for a started server."
    )
    startup_timeout_s: float = Field(
        300.0, gt=0, description="Wait this long for a started server to answer /health."
    )
    log_file: str = Field(
        "", description="Where a started server writes its output ('' = the rollout worker's own output)."
    )
    request_timeout_s: float = Field(600.0, gt=0, description="HTTP timeout of one generate request.")
    connection_retries: int = _connection_retries()
    weights_dir: str = Field(
        "",
        description="Where update_weights(state_dict=...) writes safetensors for the server to reload ('' = a temp dir).",
    )


class SglangEngineConfig(Section):
    """Client of an SGLang server's native HTTP API (rollout_service/engines/sglang.py)."""

    url: str = Field("http://127.0.0.1:30000", description="Server base URL.")
    request_timeout_s: float = Field(600.0, gt=0, description="HTTP timeout of one generate request.")
    connection_retries: int = _connection_retries()
    weights_dir: str = Field(
        "",
        description="Where update_weights(state_dict=...) writes safetensors for the server to load ('' = a temp dir).",
    )


class SimEngineConfig(Section):
    """A latency model of a GPU inference server (rollout_service/engines/sim.py).

    prefill time = prefill_base_s + prefill_s_per_token * (prompt tokens in the prefill batch);
    decode step time = decode_base_s + decode_s_per_seq * batch + decode_s_per_ctx_token * (sum of contexts).
    """

    prefill_base_s: float = Field(0.01, ge=0, description="Fixed cost of one prefill batch (s).")
    prefill_s_per_token: float = Field(2e-5, ge=0, description="Prefill cost per prompt token (s).")
    decode_base_s: float = Field(0.02, ge=0, description="Fixed cost of one decode step (s).")
    decode_s_per_seq: float = Field(1e-4, ge=0, description="Decode step cost per running sequence (s).")
    decode_s_per_ctx_token: float = Field(
        1e-7, ge=0, description="Decode step cost per context token in the batch (s)."
    )
    max_concurrency: int = Field(256, ge=1, description="Most sequences decoding at once; the rest queue.")
    output_len_median: float = Field(
        64.0, gt=0, description="Median generated length (log-normal), in tokens."
    )
    output_len_sigma: float = Field(
        1.0, ge=0, description="Sigma of log(generated length) (0 = always the median)."
    )
    vocab_size: int = Field(1000, ge=4, description="Token ids are drawn from [4, vocab_size).")
    eos_token_id: int = Field(
        2, ge=0, description="Token that ends a generation shorter than max_new_tokens."
    )
    time_scale: float = Field(
        1.0, ge=0, description="Real seconds slept per simulated second (0 = as fast as possible)."
    )
    seed: int | None = Field(
        None,
        description="Seed of the engine's length and token draws (a request's seed overrides); None = fresh "
        "entropy, so rollout workers sharing one config draw differently.",
    )
