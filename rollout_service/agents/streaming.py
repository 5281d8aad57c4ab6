"""Chat completions with `stream: true`: a ChatOutcome as server-sent events in OpenAI's
`chat.completion.chunk` format (docs/agents.md, "Streaming").

The answer is generated whole first (AgentAPI.complete_chat, exactly as for `stream: false`, so the
recorded Call is the same; tool calls can only be parsed from the whole text), then sent as events: per
choice a role delta, content deltas along the tokens (the text each group of TOKENS_PER_DELTA tokens adds
to the decoded output), the tool calls (a delta with index, id, type and name, then the arguments in
pieces), a delta with the finish_reason; with `stream_options.include_usage` every chunk has `usage: null` and a last chunk with no
choices carries the usage; then `data: [DONE]`. With `logprobs: true` each chunk carries the logprobs of
the tokens it covers, so the chunks' logprobs concatenate to the unstreamed answer's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from starlette.responses import Response

ARGUMENT_PIECE = 16  # characters of a tool call's arguments per delta
# Tokens of text per delta. The answer is whole before the first event, so finer deltas only cost: the
# `openai` client builds a pydantic model per chunk (~0.3 ms), which made a 32-token streamed call cost ~12 ms
# more than an unstreamed one (vLLM's --stream-interval groups tokens the same way).
TOKENS_PER_DELTA = 8


def sse(data: Any, event: str | None = None) -> str:
    """One server-sent event: `data: <json>` (with an `event:` line when given) and a blank line."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def token_pieces(decode: Callable[[list[int]], str], ids: list[int], window: int = 4,
                 decode_batch: Callable[[list[list[int]]], list[str]] | None = None) -> list[str]:
    """The text each token adds to the decoded output (special tokens skipped), found by decoding it after
    up to `window` tokens before it (so a SentencePiece word's leading space is kept). A token that ends
    inside a character (one byte of a multi-byte character) adds '', and the token that completes the
    character adds all of it. `decode_batch` (the Rust tokenizer's, one call for every window) is the fast
    path; where a window splits a character it falls back to decoding token by token."""
    n = len(ids)
    if decode_batch is not None:
        texts = decode_batch([ids[max(0, k - window):k] for k in range(n)] +
                             [ids[max(0, k - window):k + 1] for k in range(n)])
        fast = [a[len(b):] for b, a in zip(texts[:n], texts[n:], strict=True)
                if not a.endswith("\ufffd") and not b.endswith("\ufffd") and a.startswith(b)]
        if len(fast) == n:
            return fast
    pieces, start = [], 0  # ids[start:] are not spelled yet
    for k in range(n):
        lo = max(0, start - window)
        before, after = decode(ids[lo:start]), decode(ids[lo:k + 1])
        if after.endswith("\ufffd") or not after.startswith(before):
            pieces.append("")
            continue
        pieces.append(after[len(before):])
        start = k + 1
    return pieces


def output_pieces(ctx, ids: list[int]) -> list[str]:
    """token_pieces of an engine's output ids with the worker's tokenizer (ctx: WorkflowContext)."""
    backend = getattr(ctx.tokenizer, "backend_tokenizer", None)
    batch = None
    if hasattr(backend, "decode_batch"):
        def batch(seqs: list[list[int]]) -> list[str]:
            return backend.decode_batch(seqs, skip_special_tokens=True)
    return token_pieces(ctx.decode, list(ids), decode_batch=batch)


def content_segments(content: str, pieces: list[str]) -> tuple[list[tuple[str, int]], int]:
    """Split `content` (the text the agent is shown: stop string and tool calls cut) along the tokens:
    ([(delta, tokens it covers)], tokens left over). Tokens are taken while their pieces spell `content`
    from its start; the rest of `content` (a stripped space before a tool call, ...) is one last delta.
    The deltas always concatenate to `content`."""
    segs, at, used, pending = [], 0, 0, 0
    for p in pieces:
        if at >= len(content) or not content.startswith(p, at):
            break
        pending += 1
        used += 1
        if p:
            segs.append((p, pending))
            at, pending = at + len(p), 0
    if at < len(content):
        segs.append((content[at:], pending))
        pending = 0
    return segs, len(pieces) - used + pending


def group_segments(segs: list[tuple[str, int]], tokens: int = TOKENS_PER_DELTA) -> list[tuple[str, int]]:
    """Consecutive segments joined until each covers at least `tokens` tokens (the last may cover fewer)."""
    out: list[tuple[str, int]] = []
    for text, n in segs:
        if out and out[-1][1] < tokens:
            out[-1] = (out[-1][0] + text, out[-1][1] + n)
        else:
            out.append((text, n))
    return out


def split_arguments(arguments: str, size: int = ARGUMENT_PIECE) -> list[str]:
    return [arguments[i:i + size] for i in range(0, len(arguments), size)] or [""]


class ChunkWriter:
    """The chunks of one streamed chat completion, as SSE text."""

    def __init__(self, cid: str, created: int, model: str, fingerprint: str, include_usage: bool):
        self.base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                     "system_fingerprint": fingerprint}
        self.include_usage = include_usage
        self.events: list[str] = []

    def chunk(self, index: int, delta: dict, finish: str | None = None, logprobs: list | None = None) -> None:
        c = {**self.base, "choices": [{"index": index, "delta": delta, "logprobs": None if logprobs is None else
                                       {"content": logprobs, "refusal": None}, "finish_reason": finish}]}
        if self.include_usage:
            c["usage"] = None
        self.events.append(sse(c))

    def usage(self, usage: dict) -> None:
        self.events.append(sse({**self.base, "choices": [], "usage": usage}))

    def body(self) -> bytes:
        return ("".join(self.events) + "data: [DONE]\n\n").encode()


def stream_response(body: bytes) -> Response:
    """An SSE response whose events are all written (the client reads them as they arrive)."""
    return Response(body, media_type="text/event-stream", headers={"cache-control": "no-cache"})


class LogprobCursor:
    """Hands each chunk the logprob entries of the tokens it covers (None when they were not asked for)."""

    def __init__(self, entries: list | None):
        self.entries, self.at = entries, 0

    def take(self, n: int) -> list | None:
        if self.entries is None:
            return None
        self.at += n
        return self.entries[self.at - n:self.at]

    def rest(self) -> list | None:
        return self.take(len(self.entries) - self.at) if self.entries is not None else None


def chat_stream_body(api, req, out) -> bytes:
    """The SSE body of a streamed chat completion for the ChatOutcome `out` of `req` (api: AgentAPI)."""
    opts = req.stream_options if isinstance(req.stream_options, dict) else {}
    cid = f"chatcmpl-{out.session.id[:8]}{len(out.session.calls)}"
    w = ChunkWriter(cid, int(time.time()), api.model_name, f"v{api.ctx.engine.version}",
                    bool(opts.get("include_usage")))
    for c in out.choices:
        lp = LogprobCursor(api.logprobs_block(c.result)["content"] if req.logprobs else None)
        content, calls = c.message.get("content"), c.message.get("tool_calls") or []
        w.chunk(c.index, {"role": "assistant", "content": None if content is None and calls else "",
                          "refusal": None}, logprobs=lp.take(0))
        if content:
            segs, _ = content_segments(content, output_pieces(api.ctx, c.result.output_ids))
            for text, n in group_segments(segs):
                w.chunk(c.index, {"content": text}, logprobs=lp.take(n))
        for j, tc in enumerate(calls):  # the call's tokens' logprobs ride on its first delta
            fn = tc["function"]
            w.chunk(c.index, {"tool_calls": [{"index": j, "id": tc["id"], "type": "function",
                                              "function": {"name": fn["name"], "arguments": ""}}]},
                    logprobs=lp.rest())
            for piece in split_arguments(fn["arguments"]):
                w.chunk(c.index, {"tool_calls": [{"index": j, "function": {"arguments": piece}}]},
                        logprobs=lp.take(0))
        rest = lp.rest()  # tokens no delta showed (a cut stop string, an end-of-turn token)
        w.chunk(c.index, {}, c.finish_reason, logprobs=rest or None)
    if w.include_usage:
        w.usage(api.usage(out.prompt_ids, out.results))
    return w.body()
