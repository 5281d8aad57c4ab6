"""The Responses API, `POST /sessions/<id>/v1/responses` (docs/agents.md, "The Responses API").

A translation, both ways, of the chat route's generation (AgentAPI.complete_chat): the request's
`instructions` and `input` items (messages, `function_call`, `function_call_output`), after the
conversation of `previous_response_id`, become chat messages; function tools become chat tools,
`max_output_tokens` max_completion_tokens, `text.format` response_format; the one choice comes back as
`output` items (a `message` with `output_text`, then a `function_call` per tool call). So a Responses
call records exactly the Call the same chat request would, and a conversation continued by
`previous_response_id` or by sending the output items back merges into one sample as a chat one does.

Each response's conversation (its messages after the instructions, and the assistant reply) is kept in
the session, by response id, until the episode ends: `previous_response_id` continues it within the
episode (`store` changes nothing; `GET .../v1/responses/<id>` returns a kept response). With
`stream: true` the answer is generated whole, then sent as the API's events (response.created ...
response.completed), each with its sequence_number.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pydantic import ConfigDict, Field, ValidationError

from rollout_service.agents.chat import BadRequest, UnicodeRequest
from rollout_service.agents.streaming import (
    content_segments,
    group_segments,
    output_pieces,
    split_arguments,
    sse,
    stream_response,
)

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
CHAT_NAMES = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
              "response_format": "text.format"}


class ResponsesRequest(UnicodeRequest):
    """The fields of a Responses request this endpoint reads; others (`store`, `metadata`, `reasoning`,
    `user`, `service_tier`, `truncation`, `prompt_cache_key`, ...) are accepted and change nothing."""

    model_config = ConfigDict(extra="ignore")

    model: str = ""
    input: str | list[Any] | None = None
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_logprobs: int | None = None
    include: list[str] | None = None
    previous_response_id: str | None = None
    text: dict | None = None
    stream: bool = False
    seed: int | None = None  # not OpenAI's: as vLLM's, for reproducible sampling (extra_body={"seed": ...})
    store: bool | None = None
    metadata: dict | None = None
    background: bool | None = None
    conversation: Any = None


def _text(content: Any, param: str) -> str:
    """A Responses content (a string, or a list of input_text / output_text parts) as text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest("content must be a string or a list of input_text / output_text parts", param)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind not in TEXT_PARTS:
            raise BadRequest(f"content part of type {kind!r} is not supported: this endpoint serves text only "
                             "(input_text, output_text)", f"{param}[{j}]")
        if not isinstance(part.get("text"), str):
            raise BadRequest("a text part needs text: a string", f"{param}[{j}].text")
        out.append(part["text"])
    return "".join(out)


def input_messages(items: str | list | None) -> list[dict]:
    """Input items as chat messages: a message item as itself; consecutive `function_call` items as one
    assistant message's tool_calls (joined to the assistant message just before them, as the output of one
    response is); a `function_call_output` as a tool message; `reasoning` items are left out."""
    if items is None:
        raise BadRequest("input is required: a string or a list of input items", "input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict] = []
    for i, item in enumerate(items):
        p = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest("each input item must be an object", p)
        kind = item.get("type", "message")
        if kind == "message":
            if item.get("role") not in ROLES:
                raise BadRequest(f"role {item.get('role')!r} is not one of {', '.join(ROLES)}", f"{p}.role")
            out.append({"role": item["role"], "content": _text(item.get("content"), f"{p}.content")})
        elif kind == "function_call":
            for k in ("call_id", "name", "arguments"):
                if not isinstance(item.get(k), str):
                    raise BadRequest(f"a function_call item needs {k}: a string", f"{p}.{k}")
            try:
                args = json.loads(item["arguments"]) if item["arguments"].strip() else {}
            except json.JSONDecodeError:
                args = None
            if not isinstance(args, dict):
                raise BadRequest("arguments must be a JSON object (as a string)", f"{p}.arguments")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise BadRequest("a function_call_output item needs call_id: a string", f"{p}.call_id")
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": _text(item.get("output"), f"{p}.output")})
        elif kind == "reasoning":
            continue
        else:
            raise BadRequest(f"input item of type {kind!r} is not supported (message, function_call, "
                             "function_call_output)", f"{p}.type")
    if not out:
        raise BadRequest("input holds no message", "input")
    return out


def chat_tools(tools: list | None) -> list[dict] | None:
    """Function tools, Responses shape ({type, name, description, parameters, strict}) -> chat shape."""
    out = []
    for j, t in enumerate(tools or []):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else type(t).__name__
            raise BadRequest(f"tool of type {kind!r} is not supported: only function tools (type 'function', "
                             "name, parameters)", f"tools[{j}]")
        if isinstance(t.get("function"), dict):  # the chat-completions shape, sent here: taken as it is
            out.append(t)
            continue
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise BadRequest("a function tool needs name: a string", f"tools[{j}].name")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out or None


def chat_tool_choice(choice: str | dict | None) -> str | dict | None:
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice  # auto / none / required, or a form complete_chat judges


def response_format(text: dict | None) -> dict | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description")
                                                        if k in fmt}}
    return dict(fmt)


def responses_param(param: str | None) -> str | None:
    """The Responses name of a chat request's field (a message's index does not map: 'input')."""
    if not param:
        return None
    if param.startswith("messages"):
        return "input"
    head, dot, rest = param.partition(".")
    return CHAT_NAMES.get(head, head) + dot + rest


def wants_logprobs(req: ResponsesRequest) -> bool:
    return "message.output_text.logprobs" in (req.include or []) or bool(req.top_logprobs)


def _tool_echo(t: dict) -> dict:
    fn = t.get("function") if isinstance(t.get("function"), dict) else t
    return {"type": "function", "name": fn.get("name"), "description": fn.get("description"),
            "parameters": fn.get("parameters"), "strict": fn.get("strict", True)}


class ResponsesAPI:
    """The Responses route over an AgentAPI (`api`); `make_request` is its ChatRequest model."""

    def __init__(self, api, make_request):
        self.api, self.make_request = api, make_request

    def chat_request(self, req: ResponsesRequest, messages: list[dict]):
        if req.background:
            raise BadRequest("background: true is not supported (a response is answered when it is done)",
                             "background")
        if req.conversation is not None:
            raise BadRequest("conversation is not supported: continue with previous_response_id or send the "
                             "whole input", "conversation")
        fmt = response_format(req.text)
        if fmt is not None and "response_format" not in self.make_request.model_fields:
            raise BadRequest(f"text.format {fmt['type']!r} is not supported by this endpoint", "text.format")
        want_logprobs = wants_logprobs(req)
        fields = {"model": req.model, "messages": messages, "tools": chat_tools(req.tools),
                  "tool_choice": chat_tool_choice(req.tool_choice), "parallel_tool_calls": req.parallel_tool_calls,
                  "max_completion_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
                  "seed": req.seed, "logprobs": want_logprobs or None, "top_logprobs": req.top_logprobs,
                  "response_format": fmt}
        try:
            return self.make_request.model_validate({k: v for k, v in fields.items() if v is not None})
        except ValidationError as exc:
            err = exc.errors()[0]
            raise BadRequest(str(err.get("msg")), responses_param(".".join(str(x) for x in err.get("loc", ())))) \
                from None

    async def create(self, sid: str, req: ResponsesRequest, guard) -> Any:
        """Answer a Responses request; `guard(work)` awaits the generation (until_disconnect)."""
        session = self.api.session(sid)
        history: list[dict] = []
        if req.previous_response_id is not None:
            kept = session.responses.get(req.previous_response_id)
            if kept is None:
                raise BadRequest(f"previous_response_id {req.previous_response_id!r} is not a response of this "
                                 "episode", "previous_response_id", 400, "previous_response_not_found")
            history = kept["conversation"]
        new = input_messages(req.input)
        head = [{"role": "system", "content": req.instructions}] if req.instructions else []
        chat = self.chat_request(req, head + history + new)
        created = time.time()
        try:
            out = await guard(self.api.complete_chat(sid, chat))
        except BadRequest as exc:  # the chat route's names for its fields -> this API's
            exc.param = responses_param(exc.param)
            raise
        (choice,) = out.choices
        rid = f"resp_{uuid.uuid4().hex}"
        obj = self.response_object(rid, req, out, choice, created)
        session.responses[rid] = {"conversation": history + new + [choice.message], "object": obj}
        if req.stream:
            return stream_response(self.events(obj, choice, req))
        return obj

    def get(self, sid: str, rid: str) -> dict:
        kept = self.api.session(sid).responses.get(rid)
        if kept is None:
            raise BadRequest(f"no response {rid!r} in this episode", None, 404, "response_not_found")
        return kept["object"]

    def output_items(self, choice, logprobs: bool) -> list[dict]:
        msg, status = choice.message, "incomplete" if choice.finish_reason == "length" else "completed"
        items = []
        if msg.get("content") or not msg.get("tool_calls"):
            lps = [{k: e[k] for k in ("token", "bytes", "logprob", "top_logprobs")}
                   for e in self.api.logprobs_block(choice.result)["content"]] if logprobs else []
            items.append({"id": f"msg_{uuid.uuid4().hex}", "type": "message", "status": status, "role": "assistant",
                          "content": [{"type": "output_text", "text": msg.get("content") or "", "annotations": [],
                                       "logprobs": lps}]})
        for tc in msg.get("tool_calls") or []:
            items.append({"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "status": "completed",
                          "call_id": tc["id"], "name": tc["function"]["name"],
                          "arguments": tc["function"]["arguments"]})
        return items

    def response_object(self, rid: str, req: ResponsesRequest, out, choice, created: float) -> dict:
        done = len(choice.result.output_ids)
        incomplete = choice.finish_reason == "length"
        fmt = (req.text or {}).get("format") or {"type": "text"}
        return {
            "id": rid, "object": "response", "created_at": int(created),
            "status": "incomplete" if incomplete else "completed", "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": self.api.model_name, "output": self.output_items(choice, wants_logprobs(req)),
            "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id, "reasoning": {"effort": None, "summary": None},
            "store": True if req.store is None else req.store, "temperature": req.temperature,
            "text": {"format": fmt}, "tool_choice": req.tool_choice or "auto",
            "tools": [_tool_echo(t) for t in chat_tools(req.tools) or []], "top_p": req.top_p,
            "truncation": "disabled", "user": None, "metadata": req.metadata or {},
            "usage": {"input_tokens": len(out.prompt_ids),
                      "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                      "output_tokens": done, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": len(out.prompt_ids) + done},
        }

    def events(self, obj: dict, choice, req: ResponsesRequest) -> bytes:
        """The SSE body of a streamed response: its events in the API's order, numbered from 0."""
        events: list[str] = []

        def emit(kind: str, **fields: Any) -> None:
            events.append(sse({"type": kind, "sequence_number": len(events), **fields}, kind))

        start = {**obj, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
        emit("response.created", response=start)
        emit("response.in_progress", response=start)
        for n, item in enumerate(obj["output"]):
            if item["type"] == "message":
                part = item["content"][0]
                emit("response.output_item.added", output_index=n,
                     item={**item, "status": "in_progress", "content": []})
                emit("response.content_part.added", item_id=item["id"], output_index=n, content_index=0,
                     part={**part, "text": "", "logprobs": []})
                segs, _ = content_segments(part["text"], output_pieces(self.api.ctx, choice.result.output_ids))
                lps, at = part["logprobs"], 0
                for text, k in group_segments(segs):
                    emit("response.output_text.delta", item_id=item["id"], output_index=n, content_index=0,
                         delta=text, logprobs=lps[at:at + k])
                    at += k
                emit("response.output_text.done", item_id=item["id"], output_index=n, content_index=0,
                     text=part["text"], logprobs=lps)
                emit("response.content_part.done", item_id=item["id"], output_index=n, content_index=0, part=part)
            else:
                emit("response.output_item.added", output_index=n,
                     item={**item, "status": "in_progress", "arguments": ""})
                for piece in split_arguments(item["arguments"]):
                    emit("response.function_call_arguments.delta", item_id=item["id"], output_index=n, delta=piece)
                emit("response.function_call_arguments.done", item_id=item["id"], output_index=n,
                     arguments=item["arguments"])
            emit("response.output_item.done", output_index=n, item=item)
        emit("response.incomplete" if obj["status"] == "incomplete" else "response.completed", response=obj)
        return "".join(events).encode()
