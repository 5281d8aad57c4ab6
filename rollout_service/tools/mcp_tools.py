"""Tools from MCP servers (the official `mcp` SDK), offered to the model next to the built-in ones.

One `McpServer` per `rollout.tools.mcp` entry: a stdio subprocess (optionally inside bubblewrap) or a
streamable HTTP endpoint, shared by the worker's episodes (scope "worker") or started afresh for each
episode (scope "episode": `ToolRegistry.episode()` starts it and closes it when the episode ends). `start()` connects, initializes the session and lists the server's tools, each
exposed as a jetrl Tool named `<prefix><tool name>`. The mcp client's context managers (anyio task groups)
must be entered and left in one task: a background task holds them open until `close()`; calls are made
from the episodes' tasks on the session object.

Bounds against a hostile or broken server: connect + initialize + list within `connect_timeout_s`; at most
`max_tools` tools, each at most `max_schema_chars` (name, description and input schema); every call is
cut off by the registry's time limit. A failed call, an error result or a dead server is a ToolError (text
for the model), never an exception out of the worker. Not bounded here: the size of one JSON-RPC message
the SDK reads before handing it over (a tools/list answer is parsed whole before it is filtered).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from rollout_service.tools.base import ToolError, ToolRegistry
from shared.config.workflows import McpServerConfig, ToolsConfig

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_MAX_PAGES = 64  # tools/list pages read at most (a server paging forever cannot keep start-up busy)


class McpUnavailable(RuntimeError):
    """An MCP server could not be started, reached, initialized or listed."""


class McpTool:
    """One tool of an MCP server, as a jetrl Tool."""

    def __init__(self, server: McpServer, remote_name: str, name: str, description: str, parameters: dict):
        self.server, self.remote_name = server, remote_name
        self.name, self.description, self.parameters = name, description, parameters

    async def run(self, args: dict) -> str:
        return await self.server.call(self.remote_name, args)


def bearer_token(path: str, label: str) -> str:
    """The token in `path`, which must not be readable by group or others."""
    from shared.runtime.credentials import check_private, read_secret

    return read_secret(check_private(path, label), label)


def render_content(result: Any) -> str:
    """The text of a CallToolResult: text blocks joined, other content summarised."""
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"<{kind}: {getattr(block, 'mime_type', None) or 'unknown type'}>")
        elif kind == "resource":
            res = block.resource
            text = getattr(res, "text", None)
            parts.append(text if isinstance(text, str) else
                         f"<resource: {res.uri} ({getattr(res, 'mime_type', None) or 'binary'})>")
        elif kind == "resource_link":
            parts.append(f"<resource link: {block.uri}>")
        else:
            parts.append(f"<{kind or 'unknown'} content>")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


class McpServer:
    """A connection to one MCP server; `start()` returns its tools, `close()` ends it (idempotent)."""

    def __init__(self, cfg: McpServerConfig):
        self.cfg = cfg
        self.prefix = f"{cfg.name}." if cfg.tool_prefix is None else cfg.tool_prefix
        self.tools: list[McpTool] = []
        self.dropped: list[str] = []  # why tools offered by the server were not taken
        self._session: Any = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> list[McpTool]:
        if self._task is not None:
            raise RuntimeError(f"MCP server {self.cfg.name!r} started twice")
        self._transport_args()  # configuration errors (no bwrap, a bad token file) before anything runs
        self._task = asyncio.create_task(self._hold(), name=f"mcp-{self.cfg.name}")
        try:
            # the holder times initialize/list out itself; this is the backstop for a stuck spawn or transport
            await asyncio.wait_for(asyncio.shield(self._ready.wait()), self.cfg.connect_timeout_s + 5.0)
        except asyncio.TimeoutError:
            self._error = self._error or TimeoutError(f"no answer within {self.cfg.connect_timeout_s:g} s")
        except BaseException:
            await self.close()
            raise
        if self._session is None:
            await self.close()
            err = self._error
            raise McpUnavailable(f"MCP server {self.cfg.name!r}: cannot start: {_describe(err)}") from err
        log.info("MCP server %s (%s): %d tool(s)%s", self.cfg.name, self.cfg.transport, len(self.tools),
                 f", {len(self.dropped)} dropped" if self.dropped else "")
        return self.tools

    async def close(self) -> None:
        self._stop.set()
        task = self._task
        if task is None or task.done():
            return
        try:
            # the stdio client's shutdown is bounded (close stdin, ~2 s, SIGTERM, ~2 s, SIGKILL)
            await asyncio.wait_for(asyncio.shield(task), 10.0)
        except asyncio.TimeoutError:
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 5.0)
        except Exception:
            pass

    @property
    def alive(self) -> bool:
        return self._session is not None

    # --- the holder task ------------------------------------------------------------------------
    def _transport_args(self) -> tuple[str, Any]:
        cfg = self.cfg
        if cfg.transport == "http":
            token = bearer_token(cfg.token_file, f"{cfg.SECTION} {cfg.name!r} token_file") if cfg.token_file else ""
            return "http", token
        from mcp.client.stdio import StdioServerParameters

        argv = list(cfg.command)
        if cfg.sandbox:
            from shared.runtime import sandbox

            inner = ["/usr/bin/env"] + (["-C", cfg.cwd] if cfg.cwd else []) + [f"{k}={v}" for k, v in cfg.env.items()]
            argv = sandbox.command(inner + argv, ro_dirs=[cfg.cwd] if cfg.cwd else None)
            return "stdio", StdioServerParameters(command=argv[0], args=argv[1:])
        return "stdio", StdioServerParameters(command=argv[0], args=argv[1:], env=dict(cfg.env) or None,
                                              cwd=cfg.cwd or None)

    async def _open(self, stack: contextlib.AsyncExitStack):
        """The transport's (read, write) streams, entered on `stack`."""
        kind, arg = self._transport_args()
        if kind == "http":
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            # the SDK's default timeouts (a server may hold a response stream open), connect bounded by ours;
            # a client given to the transport is not closed by it: the stack closes it, after the transport
            timeout = httpx2.Timeout(30.0, connect=min(30.0, self.cfg.connect_timeout_s), read=300.0)
            client = await stack.enter_async_context(httpx2.AsyncClient(
                timeout=timeout, headers={"Authorization": f"Bearer {arg}"} if arg else None))
            return await stack.enter_async_context(streamable_http_client(self.cfg.url, http_client=client))
        from mcp.client.stdio import stdio_client

        return await stack.enter_async_context(stdio_client(arg, errlog=sys.stderr))

    async def _hold(self) -> None:
        import anyio
        from mcp import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._open(stack)
                session = await stack.enter_async_context(ClientSession(read, write))
                with anyio.fail_after(self.cfg.connect_timeout_s):
                    await session.initialize()
                    self.tools = await self._list(session)
                self._session = session
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001  (anyio raises ExceptionGroups; all end the connection)
            if self._error is None and not self._stop.is_set():
                self._error = exc
                if self._ready.is_set():
                    log.warning("MCP server %s: connection ended: %s", self.cfg.name, _describe(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._session = None
            self._ready.set()

    async def _list(self, session) -> list[McpTool]:
        import mcp_types

        cfg = self.cfg
        offered, cursor = [], None
        for _ in range(_MAX_PAGES):
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            offered.extend(page.tools)
            cursor = page.next_cursor
            if not cursor or len(offered) > cfg.max_tools:
                break
        if cfg.tools:  # the allow-list: only these, and each must be there
            missing = sorted(set(cfg.tools) - {t.name for t in offered})
            if missing:
                raise McpUnavailable(f"the server lists no tool {', '.join(map(repr, missing))} (rollout.tools.mcp "
                                     f"{cfg.name!r} tools)")
            offered = [t for t in offered if t.name in cfg.tools]
        out: list[McpTool] = []
        for t in offered:
            name = self.prefix + t.name
            schema = t.input_schema if isinstance(t.input_schema, dict) else {}
            schema = schema or {"type": "object", "properties": {}}
            desc = t.description or t.title or ""
            size = len(name) + len(desc) + len(json.dumps(schema, ensure_ascii=False))
            if not _NAME.match(name):
                self.dropped.append(f"{t.name[:80]!r}: name is not 1-64 of [A-Za-z0-9_.-] (with its prefix)")
            elif size > cfg.max_schema_chars:
                self.dropped.append(f"{t.name!r}: {size} chars, over max_schema_chars {cfg.max_schema_chars}")
            elif any(o.name == name for o in out):
                self.dropped.append(f"{t.name!r}: listed twice")
            elif len(out) >= cfg.max_tools:
                self.dropped.append(f"{t.name!r}: over max_tools {cfg.max_tools}")
            else:
                out.append(McpTool(self, t.name, name, desc, schema))
        if self.dropped:
            log.warning("MCP server %s: %d tool(s) dropped: %s%s", cfg.name, len(self.dropped),
                        "; ".join(self.dropped[:5]), " ..." if len(self.dropped) > 5 else "")
        return out

    # --- calls ----------------------------------------------------------------------------------
    async def call(self, remote_name: str, args: dict) -> str:
        session = self._session
        if session is None:
            raise ToolError(f"MCP server {self.cfg.name!r} is not running ({_describe(self._error)})")
        try:
            result = await session.call_tool(remote_name, args)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001  (a dead server, a protocol error, an invalid result)
            if self._session is None:
                raise ToolError(f"MCP server {self.cfg.name!r} stopped: {_describe(self._error or exc)}") from None
            raise ToolError(f"{self.prefix}{remote_name} failed: {_describe(exc)}") from None
        text = render_content(result)
        if result.is_error:
            raise ToolError(text or f"{self.prefix}{remote_name} failed (no message)")
        return text


def _describe(exc: BaseException | None) -> str:
    """One line for an error, the first leaf of an exception group."""
    while exc is not None and getattr(exc, "exceptions", None):  # an (anyio) exception group
        exc = exc.exceptions[0]
    if exc is None:
        return "unknown error"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def start_mcp_tools(cfg: ToolsConfig, registry: ToolRegistry) -> Callable[[], Awaitable[None]]:
    """Start every server of `cfg.mcp` and add its tools to `registry` (marking it `mcp_started`, so a worker
    given a registry whose servers run starts none); returns an async closer. On an error
    the servers already started are closed and the error raised (McpUnavailable, ValueError on a name clash)."""
    servers: list[McpServer] = []

    async def close() -> None:
        for s in reversed(servers):
            with contextlib.suppress(Exception):
                await s.close()

    try:
        started = [McpServer(c) for c in cfg.mcp]
        servers.extend(started)
        results = await asyncio.gather(*(s.start() for s in started), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        names = set(registry.tools)
        for tools in results:
            for t in tools:
                if t.name in names:
                    raise ValueError(f"rollout.tools.mcp {t.server.cfg.name!r}: tool {t.name!r} is already "
                                     "registered (set tool_prefix)")
                names.add(t.name)
        for server, tools in zip(started, results, strict=True):
            if server.cfg.scope == "worker":
                for t in tools:
                    registry.add(t)
            else:  # checked and listed above; each episode gets its own from now on
                await server.close()
                registry.episode_starters.append(_episode_starter(server.cfg))
    except BaseException:
        await close()
        raise
    registry.mcp_started = True
    return close


def _episode_starter(cfg: McpServerConfig):
    """Start `cfg`'s server for one episode: (its tools, its closer). A server that fails to start gives the
    episode no tools of it and a warning; the episode goes on (its calls answer that the tool is unknown)."""
    async def start():
        server = McpServer(cfg)
        try:
            return await server.start(), server.close
        except McpUnavailable as exc:
            log.warning("%s", exc)
            return [], server.close
    return start


__all__ = ["McpServer", "McpTool", "McpUnavailable", "bearer_token", "render_content", "start_mcp_tools"]
