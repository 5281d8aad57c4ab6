"""Tools an agent can call, and the registry that runs them with a time limit.

A tool is an object with `name`, `description`, `parameters` (a JSON schema of its arguments) and
`async run(args) -> str`. It raises ToolError for a failure the model should read. The registry never
raises: every outcome, including an unknown tool, bad arguments, a crash or a time-out, is text for the
model (a tool_response), plus a flag saying whether it was an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol


class ToolError(Exception):
    """A tool failure explained to the model (the message becomes the tool response)."""


class Tool(Protocol):
    name: str
    description: str
    parameters: dict  # JSON schema: {"type": "object", "properties": {...}, "required": [...]}

    async def run(self, args: dict) -> str: ...


@dataclass
class ToolCall:
    name: str
    arguments: dict


@dataclass
class ToolOutcome:
    text: str
    ok: bool
    elapsed_s: float


class ToolRegistry:
    def __init__(self, tools: list[Tool] | None = None, timeout_s: float = 5.0, max_output_chars: int = 2000):
        self.tools: dict[str, Tool] = {}
        self.timeout_s, self.max_output_chars = timeout_s, max_output_chars
        self.mcp_started = False  # set by tools/mcp_tools.py:start_mcp_tools once rollout.tools.mcp's tools are in
        # tools started afresh for each episode (MCP servers of scope "episode"): each starter returns the
        # episode's tools and their async closer
        self.episode_starters: list[Callable[[], Awaitable[tuple[list[Tool], Callable[[], Awaitable[None]]]]]] = []
        for t in tools or []:
            self.add(t)

    def add(self, tool: Tool) -> None:
        if tool.name in self.tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        self.tools[tool.name] = tool

    def __len__(self) -> int:
        return len(self.tools)

    @contextlib.asynccontextmanager
    async def episode(self):
        """The registry one episode uses: this one, or, with episode-scoped tools, a copy holding tools
        started for this episode alone (closed when it ends)."""
        if not self.episode_starters:
            yield self
            return
        own = ToolRegistry(list(self.tools.values()), self.timeout_s, self.max_output_chars)
        own.mcp_started = True
        closers = []
        try:
            for start in self.episode_starters:
                tools, close = await start()
                closers.append(close)
                for t in tools:
                    own.add(t)
            yield own
        finally:
            for close in reversed(closers):
                with contextlib.suppress(Exception):
                    await close()

    def schemas(self) -> list[dict]:
        """OpenAI-style function specs, as chat templates take them (`tools=`)."""
        return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": t.parameters}} for t in self.tools.values()]

    def check_args(self, tool: Tool, args: Any) -> str | None:
        if not isinstance(args, dict):
            return f"arguments of {tool.name} must be a JSON object, got {type(args).__name__}"
        props = tool.parameters.get("properties", {})
        missing = [k for k in tool.parameters.get("required", []) if k not in args]
        if missing:
            return f"{tool.name} needs argument(s) {', '.join(missing)}"
        unknown = [k for k in args if props and k not in props]
        if unknown:
            return f"{tool.name} has no argument(s) {', '.join(unknown)} (known: {', '.join(props)})"
        return None

    async def call(self, call: ToolCall) -> ToolOutcome:
        t0 = time.monotonic()
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            return ToolOutcome(f"error: unknown tool {call.name!r} (available: {known})", False, 0.0)
        problem = self.check_args(tool, call.arguments)
        if problem:
            return ToolOutcome(f"error: {problem}", False, 0.0)
        try:
            text, ok = await asyncio.wait_for(tool.run(call.arguments), self.timeout_s), True
        except asyncio.TimeoutError:
            text, ok = f"error: {call.name} timed out after {self.timeout_s:g} s and was stopped", False
        except ToolError as exc:
            text, ok = f"error: {exc}", False
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in a tool is the model's problem to read, never a worker crash
            text, ok = f"error: {call.name} failed: {type(exc).__name__}: {exc}", False
        text = str(text)
        if len(text) > self.max_output_chars:
            text = text[: self.max_output_chars] + f"\n... (truncated, {len(text)} chars in all)"
        return ToolOutcome(text, ok, time.monotonic() - t0)
