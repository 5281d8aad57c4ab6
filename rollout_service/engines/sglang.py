"""`sglang`: client of an SGLang server's native HTTP API.

Generation: POST /generate {"input_ids", "rid", "sampling_params", "return_logprob": true}; the tokens
and logprobs come from meta_info.output_token_logprobs ([logprob, token_id, text] per token) and the
finish reason from meta_info.finish_reason.type. Weight update: in-flight segments are aborted
(POST /abort_request {"rid"}; remote.py), then POST /update_weights_from_disk {"model_path",
"weight_version"}. User pause: POST /pause_generation {"mode": "in_place"}; resume:
POST /continue_generation. Endpoints and shapes follow SGLang's "SGLang for RL systems" and native API
docs (0.4.x-0.5.x). LoRA versions (a PEFT adapter dir): POST /load_lora_adapter {"lora_name",
"lora_path"}, then every request carries "lora_path": <that name>, and the previous adapter is
unloaded (POST /unload_lora_adapter); the server must run with --enable-lora (and --max-lora-rank,
--lora-target-modules covering the run's trainer.lora). SGLang has no CPU build: the tests run this client against a stand-in of that API
(tests/engines/engines_sglang_standin.py), not against SGLang itself.
"""

from __future__ import annotations

import logging

from rollout_service.engines.base import SamplingParams
from rollout_service.engines.remote import EngineHTTPError, RemoteEngine, Segment
from shared.config import JetrlConfig
from shared.model.adapters import is_adapter_dir

log = logging.getLogger(__name__)


def generate_body(segment_id: str, prompt_ids: list[int], p: SamplingParams, lora: str | None = None) -> dict:
    sp: dict = {
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k if p.top_k > 0 else -1,
        "max_new_tokens": p.max_new_tokens,
        "no_stop_trim": True,  # keep the stop string in the output, as the other engines do
        "skip_special_tokens": False,
    }
    if p.stop:
        sp["stop"] = list(p.stop)
    if p.stop_token_ids:
        sp["stop_token_ids"] = list(p.stop_token_ids)
    if p.seed is not None:
        sp["sampling_seed"] = int(p.seed)
    if p.ignore_eos:
        sp["ignore_eos"] = True
    if p.allowed_token_ids:  # the config refuses it for sglang; a request must not slip through unmasked
        raise ValueError("sampling.allowed_token_ids: the sglang engine cannot honour it (use local or vllm)")
    body = {"input_ids": prompt_ids, "rid": segment_id, "sampling_params": sp, "return_logprob": True}
    if lora:
        body["lora_path"] = lora
    return body


def parse_generate(resp: dict) -> Segment:
    if isinstance(resp, list):  # a batch answer: we always send one prompt
        resp = resp[0]
    meta = resp.get("meta_info") if isinstance(resp, dict) else None
    if not isinstance(meta, dict):
        raise ValueError(f"sglang: /generate response without meta_info: {str(resp)[:300]}")
    items = meta.get("output_token_logprobs") or []
    ids = [int(it[1]) for it in items]
    logprobs = [float(it[0]) for it in items]
    if not items and resp.get("output_ids"):
        raise ValueError(
            "sglang: response has output_ids but no output_token_logprobs (return_logprob ignored?)"
        )
    fr = meta.get("finish_reason") or {}
    reason = fr.get("type", "stop") if isinstance(fr, dict) else str(fr)
    if reason not in ("stop", "length", "abort"):
        reason = "stop"
    return Segment(ids, logprobs, reason)


class SglangEngine(RemoteEngine):
    name = "sglang"

    def __init__(self, cfg: JetrlConfig, version: int = 0):
        self.cfg = cfg
        self.opts = cfg.rollout.sglang
        if not self.opts.url:
            raise ValueError("rollout.sglang.url: set the SGLang server URL")
        super().__init__(self.opts.url, self.opts.request_timeout_s, self.opts.weights_dir, version,
                         self.opts.connection_retries)
        self.lora: str | None = None  # the loaded adapter's name, sent as each request's lora_path
        self.configured_max_prompt = cfg.rollout.service.max_prompt_tokens

    async def start(self) -> None:
        await super().start()
        try:  # SGLang's OpenAI-compatible /v1/models lists the served model's max_model_len
            info = await self._get("/v1/models")
            ctx = info["data"][0].get("max_model_len")
        except Exception as exc:
            log.info("sglang: no context length from /v1/models (%s): prompts are bounded by "
                     "rollout.service.max_prompt_tokens only", exc)
            return
        if isinstance(ctx, int) and ctx > 0:
            self.context_tokens = ctx

    async def health(self) -> dict:
        try:
            await self._get("/health")
            return {"ok": True, "engine": self.name, "version": self._version, "url": self.url}
        except Exception as e:
            return {"ok": False, "engine": self.name, "version": self._version, "error": str(e)[:300]}

    async def _segment(self, segment_id: str, prompt_ids: list[int], sampling: SamplingParams) -> Segment:
        return parse_generate(
            await self._post("/generate", json=generate_body(segment_id, prompt_ids, sampling, self.lora))
        )

    async def _abort_segments(self, segment_ids: list[str] | None) -> None:
        if segment_ids is None:
            await self._post("/abort_request", json={"rid": "", "abort_all": True})
            return
        for rid in segment_ids:
            await self._post("/abort_request", json={"rid": rid})

    async def _load_weights(self, version: int, path: str) -> None:
        if is_adapter_dir(path):
            name = f"{self.cfg.run}-v{version}"
            if name == self.lora:  # this very version is loaded (a version's files never change)
                return
            res = await self._post("/load_lora_adapter", json={"lora_name": name, "lora_path": path})
            if isinstance(res, dict) and res.get("success") is False:
                raise EngineHTTPError(f"sglang: /load_lora_adapter {path} failed: {res}")
            old, self.lora = self.lora, name
            await self._unload(old)
            return
        res = await self._post(
            "/update_weights_from_disk",
            json={"model_path": path, "weight_version": str(version), "flush_cache": True},
        )
        if not (isinstance(res, dict) and res.get("success")):
            raise EngineHTTPError(f"sglang: /update_weights_from_disk {path} failed: {res}")
        old, self.lora = self.lora, None  # a full version replaces the base; requests name no adapter
        await self._unload(old)

    async def _unload(self, name: str | None) -> None:
        if name is None:
            return
        try:
            await self._post("/unload_lora_adapter", json={"lora_name": name})
        except Exception as exc:  # a leftover adapter costs memory, not correctness
            log.warning("sglang: unloading LoRA adapter %s failed: %s", name, exc)

    async def _pause_server(self) -> None:
        await self._post("/pause_generation", json={"mode": "in_place"})

    async def _resume_server(self) -> None:
        await self._post("/continue_generation", json={})
