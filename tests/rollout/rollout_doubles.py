"""Small, real stand-ins for the rollout tests: a character tokenizer that can spell JSON (optionally with a
Qwen-style chat template), an engine that emits scripted ("forced") tokens through the real Engine
interface, and a maxdigit reward client."""

from __future__ import annotations

import asyncio
import math
import string
from collections.abc import Callable

from rollout_service.engines.base import Engine, GenerateRequest, GenerateResult
from shared.contract.messages import RewardResult

QWEN_LIKE_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "# Tools\n{% for t in tools %}{{ t.function.name }}\n{% endfor %}<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% elif m.role != 'system' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer(chat_template: str | None = None):
    """PreTrainedTokenizerFast, one token per printable ASCII character (+ <|im_start|>, <|im_end|>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<unk>", "<|im_start|>", "<|im_end|>"]
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                  unk_token="<unk>", additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    if chat_template:
        out.chat_template = chat_template
    return out


MCP_SERVER = str(__import__("pathlib").Path(__file__).resolve().parent / "mcp_server_example.py")


def char_policy(tmp_path):
    """A tiny random policy whose tokenizer can spell JSON (one token per character, 1024 positions), saved
    as a model directory for the local engine and the trainer: model.path = it, model.tokenizer = it/tokenizer
    (a directory without config.json loads as the fast tokenizer it is; AutoTokenizer would take qwen2's)."""
    import torch
    from transformers import AutoModelForCausalLM

    from shared.config import ModelConfig
    from shared.model.tinymodel import tiny_config

    tok = char_tokenizer()
    torch.manual_seed(0)
    conf = tiny_config(ModelConfig(), len(tok))
    conf.max_position_embeddings = 1024
    out = tmp_path / "char-policy"
    AutoModelForCausalLM.from_config(conf).save_pretrained(out)
    tok.save_pretrained(out / "tokenizer")
    return out


Script = Callable[[str, int], str]


class ScriptedEngine(Engine):
    """Emits the text `script(prompt_text, call_index)` token by token, honouring stop strings and
    max_new_tokens, `token_delay_s` apart; each token carries the version loaded when it was emitted."""

    name = "scripted"

    def __init__(self, tokenizer, script: Script, token_delay_s: float = 0.0, logprob: float = -0.25):
        self.tok, self.script, self.delay, self.logprob = tokenizer, script, token_delay_s, logprob
        self._version = 0
        self.calls = 0
        self.loaded: list[tuple[int, str | None]] = []
        self.prompts: list[str] = []
        self._paused = asyncio.Event()
        self._paused.set()

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        prompt = self.tok.decode(req.prompt_ids, skip_special_tokens=False)
        self.prompts.append(prompt)
        n = self.calls
        self.calls += 1
        target = self.tok.encode(self.script(prompt, n), add_special_tokens=False)
        out, lps, vers, finish = [], [], [], "stop"
        for i, t in enumerate(target):
            if i >= req.sampling.max_new_tokens:
                finish = "length"
                break
            await self._paused.wait()
            if self.delay:
                await asyncio.sleep(self.delay)
            out.append(t)
            lps.append(self.logprob)
            vers.append(self._version)
            text = self.tok.decode(out)
            if any(text.endswith(s) for s in req.sampling.stop):
                break
        return GenerateResult(req.request_id, list(req.prompt_ids), out, lps, vers, finish)

    async def update_weights(self, version: int, path: str | None = None, state_dict: dict | None = None) -> None:
        self.loaded.append((version, path))
        self._version = version

    async def pause(self) -> None:
        self._paused.clear()

    async def resume(self) -> None:
        self._paused.set()

    async def abort(self, request_id: str | None = None) -> int:
        return 0


def maxdigit_reward(completion: str, reference) -> float:
    return 1.0 if completion.lstrip().startswith(str(reference)) else 0.0


class MaxDigitReward:
    """RewardClient stand-in (same `score` signature) for the maxdigit scorer."""

    def __init__(self, fail: bool = False):
        self.calls: list[list[str]] = []
        self.fail = fail

    async def score(self, task, completions, reference, payload=None, completion_ids=None) -> RewardResult:
        self.calls.append(list(completions))
        if self.fail:
            return RewardResult(task=task, rewards=[0.0] * len(completions), error="no responders")
        rewards = [maxdigit_reward(c, reference) for c in completions]
        return RewardResult(task=task, rewards=rewards, metrics=[{"len": len(c)} for c in completions],
                            errors=[None] * len(completions))

    async def close(self) -> None:
        pass


def maxdigit_prompt(i: int) -> tuple[str, str]:
    digits = [(i * 7 + k * 3) % 10 for k in range(5)]
    return "max " + " ".join(map(str, digits)) + " =", str(max(digits))


def is_close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


# --- bus helpers for the service tests ------------------------------------------------------------


def worker_config(nats_url: str, run: str = "r1", **rollout):
    from shared.config import JetrlConfig

    ro = {"max_in_flight": 4, "group_size": 2, "sampling": {"max_new_tokens": 32},
          "service": {"ack_wait_s": 2.0, "fetch_batch": 4}}
    for k, v in rollout.items():
        if isinstance(v, dict) and isinstance(ro.get(k), dict):
            ro[k] = {**ro[k], **v}
        else:
            ro[k] = v
    return JetrlConfig.model_validate({
        "run": run,
        "nats": {"servers": [nats_url], "reconnect_wait_s": 0.1, "max_reconnect_wait_s": 0.5},
        "streams": {"duplicate_window_s": 120},
        "reward": {"task": "maxdigit", "timeout_s": 5.0},
        "telemetry": {"metrics_port": -1, "events_interval_s": 0.5},
        "rollout": ro,
    })


async def publish_prompts(js, nc, run: str, n: int, start: int = 0, group_size: int = 2,
                          released_at_version: int = 0) -> list[str]:
    from shared.contract import bus, subjects
    from shared.contract.messages import PromptTask

    ids = []
    for i in range(start, start + n):
        prompt, ref = maxdigit_prompt(i)
        t = PromptTask(run=run, prompt_id=f"p{i}", epoch=0, payload={"prompt": prompt, "reference": ref},
                       group_size=group_size, released_at_version=released_at_version)
        await bus.publish(js, nc, subjects.prompts(run), t, msg_id=t.group_id)
        ids.append(t.group_id)
    return ids


async def read_groups(js, run: str):
    """Every TrajectoryGroup in the TRAJECTORIES stream for `run` (in stream order)."""
    from nats.js.errors import NotFoundError

    from shared.contract import codec, subjects
    from shared.contract.messages import TrajectoryGroup

    info = await js.stream_info(subjects.TRAJECTORIES_STREAM)
    out = []
    if not info.state.messages:
        return out
    for seq in range(max(1, info.state.first_seq), info.state.last_seq + 1):
        try:
            m = await js.get_msg(subjects.TRAJECTORIES_STREAM, seq)
        except NotFoundError:
            continue
        if m.subject == subjects.trajectories(run):
            out.append(codec.decode(m.data, TrajectoryGroup))
    return out


async def wait_for(pred, timeout: float = 60.0, every: float = 0.05, what: str = "condition"):
    """Poll an (async or plain) predicate until true; fail naming `what` after `timeout` s."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if asyncio.iscoroutine(v):
            v = await v
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(every)


class KVWeights:
    """Weight announcements on the real KV bucket, fetch recorded: a stand-in for weight_store's
    announce.watch / WeightStoreClient.fetch until those are used. `gate` (an asyncio.Event) holds fetches."""

    def __init__(self, js, run: str, gate: asyncio.Event | None = None):
        self.js, self.run, self.gate = js, run, gate
        self.fetched: list[int] = []

    async def announce(self, version: int) -> None:
        from shared.contract import codec, subjects
        from shared.contract.messages import WeightVersion

        kv = await self.js.key_value(subjects.WEIGHTS_KV_BUCKET)
        await kv.put(self.run, codec.encode(WeightVersion(run=self.run, version=version)))

    async def watch(self):
        from shared.contract import codec, subjects
        from shared.contract.messages import WeightVersion

        kv = await self.js.key_value(subjects.WEIGHTS_KV_BUCKET)
        w = await kv.watch(self.run)
        async for e in w:
            if e is not None and e.value:
                yield codec.decode(e.value, WeightVersion)

    async def latest(self):
        from nats.js.errors import KeyNotFoundError

        from shared.contract import codec, subjects
        from shared.contract.messages import WeightVersion

        kv = await self.js.key_value(subjects.WEIGHTS_KV_BUCKET)
        try:
            e = await kv.get(self.run)
        except KeyNotFoundError:
            return None
        return codec.decode(e.value, WeightVersion)

    async def fetch(self, run: str, version: int):
        from pathlib import Path

        if self.gate is not None:
            await self.gate.wait()
        self.fetched.append(version)
        return Path(f"/weights/{run}/v{version}")

    async def silent_watch(self):
        """A watch that never delivers (a watcher that lags the KV)."""
        await asyncio.Event().wait()
        yield  # pragma: no cover

    def source(self, watch: bool = True):
        return (self.watch if watch else self.silent_watch), self.fetch, self.latest
