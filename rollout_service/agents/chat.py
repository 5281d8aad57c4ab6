"""OpenAI chat messages <-> tokens, for the endpoint.

`ChatRenderer.prompt_ids(messages, tools, calls)` turns a request's messages into prompt token ids. When
the messages begin with those of an earlier recorded call followed by the assistant message that call
returned, the prompt is that call's tokens (prompt + completion, exactly as generated) followed by the
rendered rest: the model's own output is never re-tokenized, so consecutive calls merge into one sample
(trajectory.py). Otherwise the whole conversation is rendered through the chat template (or, for a
tokenizer without one, as plain text: the contents joined by newlines).

`reply_message(text)` is the assistant message the endpoint returns: Hermes/Qwen `<tool_call>` blocks
become OpenAI `tool_calls` (arguments as a JSON string), the rest is `content`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import BaseModel, model_validator

from rollout_service.agents.session import Call
from rollout_service.tools.base import ToolCall
from rollout_service.tools.call_format import CALL_CLOSE, CALL_OPEN, parse_tool_calls, plain_preamble
from rollout_service.workflows.base import WorkflowContext

ROLES = ("system", "developer", "user", "assistant", "tool")


class UnicodeRequest(BaseModel):
    """Base of every API's request model: JSON may carry a lone surrogate (\\ud800) that no tokenizer
    takes; it is refused here, anywhere in the request, as a 400."""

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data: Any) -> Any:
        try:
            json.dumps(data, ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            raise ValueError(f"the request holds text that is not valid Unicode ({exc.reason}, e.g. a lone "
                             "surrogate such as \\ud800): send UTF-8 text") from None
        return data


class BadRequest(ValueError):
    """A request the endpoint cannot serve; `param` names the field (OpenAI error bodies carry it)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


def _text(s: str, param: str) -> str:
    """`s` if it is valid Unicode text (JSON can carry a lone surrogate such as \\ud800; no tokenizer takes it)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(f"text is not valid Unicode ({exc.reason} at character {exc.start}): send UTF-8 text",
                         param) from None
    return s


def text_content(content: Any, param: str) -> str:
    """A message's content as text: a string, None, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return _text(content, f"{param}.content")
    if isinstance(content, list):
        out = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(f"content part of type {kind!r} is not supported: this endpoint serves text "
                                 "only (send parts of type 'text')", f"{param}.content[{j}]")
            out.append(_text(str(part.get("text", "")), f"{param}.content[{j}].text"))
        return "".join(out)
    raise BadRequest("content must be a string or a list of text parts", f"{param}.content")


def _arguments(raw: Any, param: str) -> dict:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            val = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            raise BadRequest("function.arguments is not valid JSON", param) from None
        if isinstance(val, dict):
            return val
    raise BadRequest("function.arguments must be a JSON object (as a string)", param)


def normalise_messages(messages: list[Any]) -> list[dict]:
    """Messages as the chat template takes them: text content, tool-call arguments as dicts. Raises
    BadRequest naming the message that is wrong."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest("each message must be an object with 'role' and 'content'", param)
        role = m.get("role")
        if role not in ROLES:
            raise BadRequest(f"role {role!r} is not one of {', '.join(ROLES)}", f"{param}.role")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                               "content": text_content(m.get("content"), param)}
        if role == "assistant" and m.get("tool_calls"):
            if not isinstance(m["tool_calls"], list):
                raise BadRequest("tool_calls must be a list of tool calls", f"{param}.tool_calls")
            calls = []
            for j, tc in enumerate(m["tool_calls"]):
                fn = tc.get("function") if isinstance(tc, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise BadRequest("a tool call needs function.name", f"{param}.tool_calls[{j}]")
                calls.append({"type": "function", "id": str(tc.get("id", "")), "function": {
                    "name": fn["name"], "arguments": _arguments(fn.get("arguments", {}),
                                                                f"{param}.tool_calls[{j}].function.arguments")}})
            msg["tool_calls"] = calls
        if role == "tool" and m.get("tool_call_id") is not None:
            msg["tool_call_id"] = str(m["tool_call_id"])
        if m.get("name") is not None and role != "tool":
            msg["name"] = str(m["name"])
        out.append(msg)
    return out


def _same_reply(sent: dict, ours: dict) -> bool:
    """The agent's copy of an assistant message equals the one we returned (ids aside)."""
    if sent.get("role") != "assistant" or (sent.get("content") or "") != (ours.get("content") or ""):
        return False
    a = [(c["function"]["name"], c["function"]["arguments"]) for c in sent.get("tool_calls") or []]
    b = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in ours.get("tool_calls") or []]
    return a == b


def _key(m: dict) -> dict:
    return {k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id", "name")} | {
        "tool_calls": [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]}


def _calls_as_text(m: dict) -> dict:
    """`m` with its tool calls appended to its content as the model writes them: <tool_call>{"name": ...,
    "arguments": {...}}</tool_call> (arguments decoded where they are JSON, as parse_tool_calls reads them)."""
    text = m.get("content") or ""
    for c in m.get("tool_calls") or []:
        args = c["function"]["arguments"]
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            pass
        text += f"{CALL_OPEN}{json.dumps({'name': c['function']['name'], 'arguments': args})}{CALL_CLOSE}"
    return {k: v for k, v in m.items() if k != "tool_calls"} | {"content": text}


class ChatRenderer:
    def __init__(self, ctx: WorkflowContext):
        self.ctx = ctx

    @property
    def template_knows_tools(self) -> bool:
        return "tools" in str(getattr(self.ctx.tokenizer, "chat_template", "") or "")

    def template_messages(self, messages: list[dict], tools: list[dict] | None) -> list[dict]:
        """For a chat template that ignores `tools=` (SmolLM2's): the tool preamble in the system message, and
        each assistant message's `tool_calls` as the <tool_call> text the model writes (such a template renders
        only `content`, so calls given in the history, e.g. a worked example, would otherwise vanish)."""
        if self.template_knows_tools:
            return messages
        messages = [_calls_as_text(m) if m.get("tool_calls") else m for m in messages]
        if not tools:
            return messages
        pre = plain_preamble(tools)
        if messages and messages[0]["role"] == "system":
            return [{**messages[0], "content": messages[0]["content"] + "\n\n" + pre}, *messages[1:]]
        return [{"role": "system", "content": pre}, *messages]

    def render_text(self, messages: list[dict], tools: list[dict] | None) -> str:
        if self.ctx.has_chat_template:
            try:
                return self.ctx.apply_template(self.template_messages(messages, tools), tools,
                                               add_generation_prompt=True)
            except Exception as exc:  # jinja raises for what a template does not accept (roles, order)
                raise BadRequest(f"the model's chat template refused these messages: {exc}", "messages") from None
        head = plain_preamble(tools) + "\n" if tools else ""
        return head + "\n".join(self._plain(m) for m in messages)

    @staticmethod
    def _plain(m: dict) -> str:
        return _calls_as_text(m)["content"]

    def _continuation(self, prev: Call, rest: list[dict], tools: list[dict] | None) -> list[int]:
        if not self.ctx.has_chat_template:
            return self.ctx.encode("\n" + "\n".join(self._plain(m) for m in rest))
        try:
            return self.ctx.continuation_ids(self.template_messages(prev.messages, tools), prev.text, prev.raw, rest,
                                             plain_text="", tools=tools)
        except Exception as exc:
            raise BadRequest(f"the model's chat template refused these messages: {exc}", "messages") from None

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None, calls: list[Call]) -> list[int]:
        """Prompt token ids of a chat request (see the module doc for the reuse of recorded tokens)."""
        keys = [_key(m) for m in messages]
        best: Call | None = None
        for call in calls:
            n = len(call.messages or ())
            if (call.messages is not None and call.reply is not None and len(messages) > n + 1
                    and (best is None or n > len(best.messages))
                    and call.tools == (tools or None)
                    and [_key(m) for m in call.messages] == keys[:n] and _same_reply(messages[n], call.reply)):
                best = call
        if best is not None:
            return best.tokens + self._continuation(best, messages[len(best.messages) + 1:], tools)
        return self.ctx.encode(self.render_text(messages, tools))


def reply_message(text: str, parse_tools: bool) -> tuple[dict, bool]:
    """(the OpenAI assistant message, whether it holds tool calls) for the model's output `text`."""
    items = parse_tool_calls(text) if parse_tools and CALL_OPEN in text else []
    calls = [i for i in items if isinstance(i, ToolCall)]
    if not calls or len(calls) != len(items):  # none, or a malformed one: the agent gets the raw text
        return {"role": "assistant", "content": text}, False
    content = text[:text.find(CALL_OPEN)].strip()
    return {"role": "assistant", "content": content or None, "tool_calls": [
        {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
         "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]}, True
