"""What a chat request asks of the sampler beyond plain sampling: a forced tool call (`tool_choice`
"required" or a named function), several tool calls per turn (`parallel_tool_calls`) and structured output
(`response_format`), turned into a grammar constraint (engines/constraint.py) and stop strings.

- `tool_choice: "required"` or `{"type": "function", "function": {"name": N}}` (or the Responses API's
  `{"type": "function", "name": N}`): the output is constrained to tool-call blocks,
  `<tool_call>{"name": <an offered tool / N>, "arguments": <its parameters schema>}</tool_call>`, so it
  always parses as a call of an allowed tool with arguments that validate against its schema.
- `response_format` json_object / json_schema: the answer is one JSON value of that schema; with tools
  offered (tool_choice auto) the model may instead call tools (either alternative is constrained).
- several calls per turn (`parallel_tool_calls` not false, and a chat template that renders several
  tool calls, or none at all): the sampler no longer stops at the first `</tool_call>` but at the end of
  the turn (EOS, or a `<tool_response>` the model starts to invent, whose tokens stay recorded).

Every token stays sampled: a constrained token is drawn from the grammar-masked distribution and its
recorded logprob is that distribution's (docs/agents.md, "Constrained decoding").
"""

from __future__ import annotations

import json
import re
from typing import Any

from rollout_service.agents.chat import BadRequest
from rollout_service.engines.constraint import Constraint, json_schema_lark
from rollout_service.tools.call_format import CALL_CLOSE, CALL_OPEN

RESPONSE_OPEN = "<tool_response>"  # the model inventing a tool's answer: its turn is over
_LOOPS_OVER_CALLS = re.compile(r"for\s+\w+\s+in\s+[\w.]*tool_calls")


def forced_tools(choice: Any, tools: list[dict] | None) -> list[dict] | None:
    """The tools the reply must call one of, or None when the model may answer in text."""
    if choice is None or choice in ("auto", "none"):
        return None
    if choice == "required":
        if not tools:
            raise BadRequest("tool_choice 'required' needs tools", "tool_choice")
        return tools
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else choice.get("name")
        if not isinstance(name, str):
            raise BadRequest("tool_choice: a function choice needs function.name", "tool_choice")
        named = [t for t in tools or [] if t["function"]["name"] == name]
        if not named:
            raise BadRequest(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
        return named[:1]
    raise BadRequest("tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": "
                     "{\"name\": ...}}", "tool_choice")


def response_schema(fmt: Any) -> dict | None:
    """The JSON schema `response_format` asks for (None for text)."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise BadRequest("response_format json_schema needs json_schema.schema: a JSON schema object",
                             "response_format.json_schema.schema")
        return schema
    raise BadRequest(f"response_format type {kind!r} is not supported (text, json_object, json_schema)",
                     "response_format.type")


def several_calls(template: str | None, parallel: bool | None) -> bool:
    """Whether a turn may hold several tool calls: parallel_tool_calls not false, and a chat template that
    renders a list of tool calls (or no template: the plain text layout takes any number)."""
    if parallel is False:
        return False
    return not template or bool(_LOOPS_OVER_CALLS.search(template))


def _call_schema(tools: list[dict]) -> dict:
    alts = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                              "arguments": t["function"].get("parameters") or {"type": "object"}},
             "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


def grammar(forced: list[dict] | None, offered: list[dict] | None, schema: dict | None, several: bool) -> str:
    """The Lark grammar of a constrained turn: tool-call blocks of `forced` (or, with a schema and tools
    offered, either the schema's answer or calls of the offered tools)."""
    tools = forced or offered or []
    rules = [f'calls: call {"(" + json.dumps(chr(10)) + " call)*" if several else ""}',
             f'call: {json.dumps(CALL_OPEN)} {json.dumps(chr(10))}? {json_schema_lark(_call_schema(tools))} '
             f'{json.dumps(chr(10))}? {json.dumps(CALL_CLOSE)}'] if tools else []
    if forced:
        start = "start: calls"
    elif tools:
        start = "start: answer | calls"
        rules.append(f"answer: {json_schema_lark(schema or {})}")
    else:
        start = f"start: {json_schema_lark(schema or {})}"
    return "\n".join([start, *rules]) + "\n"


def check_schemas(tools: list[dict], schema: dict | None) -> None:
    """400 naming the tool parameters or response schema the grammar library cannot compile."""
    for j, t in enumerate(tools):
        params = t["function"].get("parameters")
        if params is not None:
            _check(Constraint("json_schema", params), f"tools[{j}].function.parameters")
    if schema is not None:
        _check(Constraint("json_schema", schema), "response_format")


def _check(c: Constraint, param: str) -> None:
    try:
        c.check()
    except ImportError:
        raise BadRequest(f"{param}: constrained decoding needs llguidance on the rollout worker "
                         "(pip install 'jetrl[agents]')", param) from None
    except ValueError as exc:
        raise BadRequest(f"{param}: {exc}", param) from None


def turn_constraint(forced: list[dict] | None, offered: list[dict] | None, schema: dict | None,
                    several: bool) -> Constraint | None:
    """The constraint of one chat turn (None when nothing is constrained)."""
    if not forced and schema is None:
        return None
    check_schemas(forced or offered or [], schema)
    if not forced and not offered:
        return Constraint("json_schema", schema)
    c = Constraint("lark", grammar(forced, offered, schema, several))
    _check(c, "tool_choice" if forced else "response_format")
    return c


def turn_stops(offered: list[dict] | None, several: bool) -> list[str]:
    """Stop strings a turn with tools adds: the first `</tool_call>`, or, with several calls, the
    `<tool_response>` a model would invent after its calls."""
    if not offered:
        return []
    return [RESPONSE_OPEN] if several else [CALL_CLOSE]


def plan_turn(req: Any, tools: list[dict] | None, template: str | None, sp: Any, engine: Any):
    """(offered tools, sampling params) of a chat turn: tool_choice, parallel_tool_calls and response_format
    applied to `sp` (constraint and stop strings), checked against what the engine can honour (400 naming the
    field otherwise)."""
    from dataclasses import replace

    choice = req.tool_choice if req.tool_choice is not None else "auto"
    forced = forced_tools(choice, tools)
    offered = tools if choice != "none" else None
    schema = response_schema(getattr(req, "response_format", None))
    several = bool(offered) and several_calls(template, req.parallel_tool_calls)
    constraint = turn_constraint(forced, offered, schema, several)
    sp = replace(sp, stop=list(sp.stop) + turn_stops(offered, several), constraint=constraint)
    try:
        engine.check_support(sp)
    except ValueError as exc:
        param = ("top_logprobs" if "top_logprobs" in str(exc) else "tool_choice" if forced else "response_format")
        raise BadRequest(f"{param}: {exc}", param) from None
    return offered, sp
