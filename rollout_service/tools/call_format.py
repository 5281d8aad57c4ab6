"""The tool-call text format of the Hermes / Qwen chat templates: `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>` in the model's turn, `<tool_response>` blocks for the results (tokenizers without a chat template
get `plain_preamble` and `plain_response`). The tool_agent workflow and the OpenAI-compatible endpoint both
speak it."""

from __future__ import annotations

import json
import re

from rollout_service.tools.base import ToolCall

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)


def parse_tool_calls(text: str) -> list[ToolCall | str]:
    """The tool calls in a model turn, in order; a malformed one becomes an error message (str)."""
    out: list[ToolCall | str] = []
    for n, m in enumerate(_CALL.finditer(text), 1):
        body = m.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            out.append(f"error: tool call {n} is not valid JSON ({exc.msg} at char {exc.pos}); write "
                       f'{CALL_OPEN}{{"name": "<tool>", "arguments": {{...}}}}{CALL_CLOSE}')
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            out.append(f"error: tool call {n} needs a JSON object with a string 'name'")
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                out.append(f"error: tool call {n}: 'arguments' is a string that is not JSON")
                continue
        if not isinstance(args, dict):
            out.append(f"error: tool call {n}: 'arguments' must be a JSON object")
            continue
        out.append(ToolCall(obj["name"], args))
    tail = text[text.rfind(CALL_CLOSE) + len(CALL_CLOSE):] if out else text
    if CALL_OPEN in tail:
        out.append(f"error: tool call not closed; end it with {CALL_CLOSE}")
    return out


def plain_preamble(schemas: list[dict]) -> str:
    """Tool instructions for tokenizers without a chat template."""
    lines = ["You can use tools:"]
    for s in schemas:
        f = s["function"]
        params = f.get("parameters") or {}  # both optional in OpenAI's tool schema
        lines.append(f"- {f['name']}({', '.join(params.get('properties') or {})}): {f.get('description', '')}")
    lines.append(f'Call one as {CALL_OPEN}{{"name": "...", "arguments": {{...}}}}{CALL_CLOSE}; '
                 "its result comes back in <tool_response>. Then answer.")
    return "\n".join(lines)


def plain_response(texts: list[str]) -> str:
    return "".join(f"\n<tool_response>\n{t}\n</tool_response>\n" for t in texts)
