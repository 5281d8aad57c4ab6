"""Anthropic's Messages API on the agent endpoint: `POST /sessions/<id>/v1/messages` (docs/agents.md).

The unmodified Anthropic SDK works with `base_url=".../sessions/<id>"` (it appends `/v1/messages`) and the
session's key as `api_key` (sent as `x-api-key` or `Authorization: Bearer`; api.py's SessionAuth checks
either before the body is read). A request is translated into a ChatRequest — `system` the first message,
`tool_use` blocks an assistant's `tool_calls`, `tool_result` blocks `tool` messages, `tools` functions,
`tool_choice` any/tool `"required"`/a named function — and generated and recorded by
AgentAPI.complete_chat exactly as chat completions are; its ChatOutcome comes back as a Message (text and
`tool_use` content blocks, `stop_reason`, `usage`) or, with `stream: true`, as the Messages SSE events.
Errors on this route have Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`, the
message beginning with the field it is about.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from rollout_service.agents.api import AgentAPI, ChatOutcome, ChatRequest, until_disconnect
from rollout_service.agents.chat import BadRequest, UnicodeRequest
from rollout_service.agents.streaming import content_segments, sse, stream_response, token_pieces
from rollout_service.engines.base import PromptTooLong

PATH_SUFFIX = "/v1/messages"
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
               422: "invalid_request_error", 429: "rate_limit_error", 529: "overloaded_error"}
# ChatRequest's field names in complete_chat's errors -> this API's
PARAMS = {"stop": "stop_sequences", "n": "max_tokens", "max_completion_tokens": "max_tokens"}


def error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def error_response(status: int, message: str, param: str | None = None, headers: dict | None = None) -> JSONResponse:
    named = param and not message.startswith(f"{param}:")
    return JSONResponse(error_body(status, f"{param}: {message}" if named else message), status_code=status,
                        headers=headers)


def auth_refusal(status: int, message: str) -> tuple[bytes, str]:
    """SessionAuth's refusal (401, 413) on this route, in Anthropic's shape."""
    if status == 401:
        message = f"x-api-key: {message} (send the episode's key as x-api-key or as Authorization: Bearer)"
    return json.dumps(error_body(status, message)).encode(), "application/json"


class MessagesRequest(UnicodeRequest):
    """The request body. Fields not listed (`metadata`, `service_tier`, `cache_control`, ...) change
    nothing here and are ignored; `seed` is jetrl's (the SDK sends it with `extra_body`)."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int = Field(ge=1)
    messages: list[Any]
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: dict | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stop_sequences: list[str] | None = None
    metadata: dict | None = None
    stream: bool = False
    thinking: dict | None = None
    output_config: dict | None = None
    output_format: dict | None = None
    seed: int | None = None


def _blocks(content: Any, param: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadRequest("content must be a string or a list of content blocks", param)
    for j, b in enumerate(content):
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise BadRequest("each content block must be an object with a type", f"{param}[{j}]")
    return content


def _text(block: dict, param: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise BadRequest("a text block needs text: a string", f"{param}.text")
    return text


def _unsupported(kind: str, param: str) -> BadRequest:
    return BadRequest(f"content block of type {kind!r} is not supported: this endpoint serves text, tool_use and "
                      "tool_result blocks", param)


def _result_text(block: dict, param: str) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for k, b in enumerate(content):
            if not isinstance(b, dict) or b.get("type") != "text":
                raise _unsupported(b.get("type") if isinstance(b, dict) else type(b).__name__, f"{param}.content[{k}]")
            parts.append(_text(b, f"{param}.content[{k}]"))
        text = "".join(parts)
    else:
        raise BadRequest("tool_result content must be a string or a list of text blocks", f"{param}.content")
    return f"Error: {text}" if block.get("is_error") else text


def chat_messages(req: MessagesRequest) -> list[dict]:
    """The conversation as chat messages (see the module doc); raises BadRequest naming the block."""
    out: list[dict] = []
    if req.system is not None:
        system = req.system if isinstance(req.system, str) else "".join(
            _text(b, f"system[{j}]") if isinstance(b, dict) and b.get("type") == "text" else
            _raise(_unsupported(str(b.get("type") if isinstance(b, dict) else b), f"system[{j}]"))
            for j, b in enumerate(req.system))
        if system:
            out.append({"role": "system", "content": system})
    if not req.messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    for i, m in enumerate(req.messages):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest("each message must be an object with role and content", p)
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise BadRequest(f"role {role!r} is not one of user, assistant (the system prompt is the top-level "
                             "system field)", f"{p}.role")
        blocks = _blocks(m.get("content"), f"{p}.content")
        if role == "assistant":
            texts, calls = [], []
            for j, b in enumerate(blocks):
                bp = f"{p}.content[{j}]"
                if b["type"] == "text":
                    texts.append(_text(b, bp))
                elif b["type"] == "tool_use":
                    if not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                        raise BadRequest("a tool_use block needs name: a string and input: an object", bp)
                    calls.append({"type": "function", "id": str(b.get("id", "")),
                                  "function": {"name": b["name"], "arguments": b.get("input", {})}})
                else:
                    raise _unsupported(b["type"], bp)
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
            continue
        if not blocks:
            raise BadRequest("a user message needs content", f"{p}.content")
        texts = []
        for j, b in enumerate(blocks):
            bp = f"{p}.content[{j}]"
            if b["type"] == "text":
                texts.append(_text(b, bp))
            elif b["type"] == "tool_result":
                if texts:
                    out.append({"role": "user", "content": "".join(texts)})
                    texts = []
                out.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")),
                            "content": _result_text(b, bp)})
            else:
                raise _unsupported(b["type"], bp)
        if texts:
            out.append({"role": "user", "content": "".join(texts)})
    if req.messages[-1].get("role") == "assistant":
        raise BadRequest("a final assistant message (prefill: continuing the model's turn) is not supported; "
                         "end with a user message", f"messages[{len(req.messages) - 1}]")
    return out


def _raise(exc: Exception) -> str:
    raise exc


def chat_tools(req: MessagesRequest) -> tuple[list[dict] | None, Any, bool | None]:
    """(tools, tool_choice, parallel_tool_calls) in chat completions' terms."""
    tools = None
    if req.tools:
        tools = []
        for j, t in enumerate(req.tools):
            if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                raise BadRequest("each tool needs a name", f"tools[{j}]")
            if t.get("type") not in (None, "custom"):
                raise BadRequest(f"tool type {t.get('type')!r} (a server tool) is not supported: define client "
                                 "tools with name, description and input_schema", f"tools[{j}].type")
            if not isinstance(t.get("input_schema"), dict):
                raise BadRequest("input_schema must be a JSON schema object", f"tools[{j}].input_schema")
            tools.append({"type": "function", "function": {"name": t["name"], "description": str(
                t.get("description") or ""), "parameters": t["input_schema"]}})
    tc = req.tool_choice
    if tc is None:
        return tools, None, None
    parallel = None if "disable_parallel_tool_use" not in tc else not tc["disable_parallel_tool_use"]
    kind = tc.get("type")
    if kind == "tool":
        if not isinstance(tc.get("name"), str):
            raise BadRequest("tool_choice of type tool needs name: the tool's name", "tool_choice.name")
        return tools, {"type": "function", "function": {"name": tc["name"]}}, parallel
    choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if choice is None:
        raise BadRequest(f"tool_choice.type {kind!r} is not one of auto, any, tool, none", "tool_choice.type")
    return tools, choice, parallel


def _response_format(req: MessagesRequest) -> dict | None:
    """Structured output (`output_config.format`, or the older `output_format`) as chat's response_format;
    refused where chat completions do not take it (never silently ignored)."""
    fmt, param = ((req.output_config or {}).get("format"), "output_config.format")
    if fmt is None and req.output_format is not None:
        fmt, param = req.output_format, "output_format"
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise BadRequest("the format must be {type: json_schema, schema: {...}}", param)
    if "response_format" not in ChatRequest.model_fields:
        raise BadRequest("structured output is not supported by this endpoint", param)
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def to_chat(req: MessagesRequest) -> ChatRequest:
    """The ChatRequest complete_chat generates and records for this Messages request."""
    thinking = req.thinking or {}
    if thinking and thinking.get("type") != "disabled":
        raise BadRequest(f"thinking of type {thinking.get('type')!r} is not supported: the policy has no thinking "
                         "mode; leave thinking unset or send {type: disabled}", "thinking")
    tools, choice, parallel = chat_tools(req)
    body: dict[str, Any] = {"model": req.model, "messages": chat_messages(req), "tools": tools,
                            "tool_choice": choice, "parallel_tool_calls": parallel, "max_tokens": req.max_tokens,
                            "temperature": req.temperature, "top_p": req.top_p, "stop": req.stop_sequences,
                            "seed": req.seed, "top_k": req.top_k}
    fmt = _response_format(req)
    if fmt is not None:
        body["response_format"] = fmt
    return ChatRequest.model_validate(body)


def _stop(api: AgentAPI, out: ChatOutcome, stop: list[str]) -> tuple[str, str | None]:
    c = out.choices[0]
    if c.finish_reason == "tool_calls":
        return "tool_use", None
    if c.finish_reason == "length":
        return "max_tokens", None
    text = api.ctx.decode(c.result.output_ids)
    for s in stop:
        if text.endswith(s):
            return "stop_sequence", s
    return "end_turn", None


def message_body(api: AgentAPI, out: ChatOutcome, stop: list[str]) -> dict:
    """The Message of a ChatOutcome (one choice): text, then one tool_use block per tool call."""
    c = out.choices[0]
    content: list[dict] = []
    if c.message.get("content"):
        content.append({"type": "text", "text": c.message["content"]})
    for tc in c.message.get("tool_calls") or []:
        args = tc["function"]["arguments"]
        content.append({"type": "tool_use", "id": "toolu_" + tc["id"].removeprefix("call_"),
                        "name": tc["function"]["name"], "input": json.loads(args) if isinstance(args, str) else args})
    reason, seq = _stop(api, out, stop)
    return {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "content": content,
            "model": api.model_name, "stop_reason": reason, "stop_sequence": seq,
            "usage": {"input_tokens": len(out.prompt_ids), "output_tokens": len(c.result.output_ids)}}


def stream_body(api: AgentAPI, out: ChatOutcome, msg: dict) -> bytes:
    """The Messages SSE events of `msg`: message_start, per content block content_block_start, its deltas
    (text_delta along the tokens, input_json_delta) and content_block_stop, message_delta (stop_reason,
    usage), message_stop."""
    usage = msg["usage"]
    start = {**msg, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 0}}
    events = [sse({"type": "message_start", "message": start}, "message_start"), sse({"type": "ping"}, "ping")]
    for i, block in enumerate(msg["content"]):
        if block["type"] == "text":
            events.append(sse({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
                              "content_block_start"))
            segs, _ = content_segments(block["text"], token_pieces(api.ctx.decode, list(out.choices[0].result.output_ids)))
            events += [sse({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": t}},
                           "content_block_delta") for t, _ in segs]
        else:
            events.append(sse({"type": "content_block_start", "index": i, "content_block": {
                "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}, "content_block_start"))
            events.append(sse({"type": "content_block_delta", "index": i, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(block["input"])}}, "content_block_delta"))
        events.append(sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
    events.append(sse({"type": "message_delta", "delta": {"stop_reason": msg["stop_reason"],
                                                          "stop_sequence": msg["stop_sequence"]},
                       "usage": {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"]}},
                      "message_delta"))
    events.append(sse({"type": "message_stop"}, "message_stop"))
    return "".join(events).encode()


def _validation_message(exc: ValidationError) -> str:
    """'field: what is wrong' for each of the first errors (a translated ChatRequest's names mapped back)."""
    def name(loc) -> str:
        dotted = ".".join(str(x) for x in loc)
        return PARAMS.get(dotted, dotted) or "body"

    return "; ".join(f"{name(e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()[:5])


async def create_message(api: AgentAPI, sid: str, request: Request) -> Response:
    """The route: the body read and validated here (so every error on it has Anthropic's shape)."""
    try:
        api.session(sid)
        raw = await request.body()
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error_response(400, f"the body is not valid JSON ({exc})")
        if not isinstance(data, dict):
            return error_response(400, "the body must be a JSON object")
        req = MessagesRequest.model_validate(data)
        chat_req = to_chat(req)  # its BadRequests name this API's fields
    except ValidationError as exc:
        return error_response(400, _validation_message(exc))
    except BadRequest as exc:
        return error_response(exc.status, str(exc), exc.param)
    except StarletteHTTPException as exc:  # the body over rollout.agent.max_request_bytes while read
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)
    try:
        out = await until_disconnect(request, api.complete_chat(sid, chat_req))
    except BadRequest as exc:  # complete_chat names the ChatRequest's fields: this API's names instead
        p = exc.param
        return error_response(exc.status, str(exc), None if p is None else "messages" if p.startswith("messages")
                              else PARAMS.get(p, p))
    except PromptTooLong as exc:
        return error_response(400, str(exc), "messages")
    except UnicodeError as exc:
        return error_response(400, f"the request holds text that is not valid Unicode: {exc}")
    msg = message_body(api, out, list(req.stop_sequences or []))
    if req.stream:  # generated and recorded whole first, then sent as events (as chat completions are)
        return stream_response(stream_body(api, out, msg))
    return JSONResponse(msg)
