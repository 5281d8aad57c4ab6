"""Tools from MCP servers: real servers (tests/rollout/mcp_server_example.py, the mcp SDK's MCPServer) over
stdio and streamable HTTP, through the registry, the tool_agent workflow and the rollout worker."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError
from rollout_doubles import (
    MaxDigitReward,
    ScriptedEngine,
    char_policy,
    char_tokenizer,
    worker_config,
)

from rollout_service.tools import ToolCall, ToolRegistry, build_tools
from rollout_service.tools.mcp_tools import McpServer, McpUnavailable, start_mcp_tools
from rollout_service.workflows import WorkflowContext
from rollout_service.workflows.tool_agent import ToolAgentWorkflow
from shared.config import JetrlConfig
from shared.config.workflows import McpServerConfig, ToolsConfig
from shared.contract.messages import PromptTask
from shared.runtime.credentials import SecretFileError
from shared.runtime.natsd import free_port

HERE = Path(__file__).resolve().parent
SERVER = str(HERE / "mcp_server_example.py")


def stdio_cfg(**kw) -> McpServerConfig:
    args = kw.pop("args", [])
    return McpServerConfig(**{"name": "ex", "command": [sys.executable, SERVER, *args], **kw})


async def call(reg: ToolRegistry, name: str, **args):
    return await reg.call(ToolCall(name, args))


@pytest.fixture
async def ex():
    server = McpServer(stdio_cfg())
    reg = ToolRegistry(await server.start(), timeout_s=10)
    yield server, reg
    await server.close()


async def test_stdio_server_tools_are_listed_with_prefixed_names_and_schemas(ex):
    server, reg = ex
    assert list(reg.tools) == ["ex.add", "ex.echo", "ex.fail", "ex.pid", "ex.instance"]
    spec = {s["function"]["name"]: s["function"] for s in reg.schemas()}
    assert spec["ex.add"]["description"] == "Add two integers."
    assert spec["ex.add"]["parameters"]["required"] == ["a", "b"]
    assert spec["ex.add"]["parameters"]["properties"]["a"]["type"] == "integer"


async def test_stdio_calls_return_text_and_errors_come_back_as_error_outcomes(ex):
    _, reg = ex
    out = await call(reg, "ex.add", a=2, b=40)
    assert (out.text, out.ok) == ("42", True)
    assert (await call(reg, "ex.echo", text="héllo\nworld")).text == "héllo\nworld"
    bad = await call(reg, "ex.fail", reason="no way")
    assert not bad.ok and bad.text.startswith("error: ") and bad.text.endswith("refused: no way")
    wrong = await call(reg, "ex.add", a="x", b=1)  # the server's argument validation, as an error outcome
    assert not wrong.ok and "validation error" in wrong.text
    assert (await call(reg, "ex.add", a=1, b=1)).text == "2"  # the session is still good


async def test_concurrent_calls_share_one_session(ex):
    _, reg = ex
    outs = await asyncio.gather(*(call(reg, "ex.add", a=i, b=i) for i in range(20)))
    assert [o.text for o in outs] == [str(2 * i) for i in range(20)]


async def test_a_killed_server_gives_error_outcomes_not_exceptions(ex):
    server, reg = ex
    pid = int((await call(reg, "ex.pid")).text)
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    for _ in range(3):
        out = await asyncio.wait_for(call(reg, "ex.echo", text="hi"), 15)
        assert not out.ok and out.text.startswith("error:"), out
    assert time.monotonic() - t0 < 12
    await asyncio.wait_for(server.close(), 15)
    out = await call(reg, "ex.echo", text="hi")
    assert not out.ok and "not running" in out.text


async def test_a_hostile_server_is_bounded_in_tools_and_schema_size():
    server = McpServer(stdio_cfg(args=["hostile"], max_tools=6, max_schema_chars=2000, tool_prefix=""))
    try:
        tools = await server.start()
    finally:
        await server.close()
    names = [t.name for t in tools]
    assert names == ["add", "echo", "fail", "pid", "instance", "spam_000"]  # unprefixed; huge dropped
    assert any("'huge'" in d and "max_schema_chars" in d for d in server.dropped)
    assert sum("over max_tools" in d for d in server.dropped) == 199


async def test_a_server_that_does_not_answer_fails_start_within_the_connect_timeout(tmp_path):
    script = tmp_path / "mute.py"
    script.write_text("import time\ntime.sleep(60)\n")
    server = McpServer(McpServerConfig(name="mute", command=[sys.executable, str(script)], connect_timeout_s=1.0))
    t0 = time.monotonic()
    with pytest.raises(McpUnavailable, match="mute"):
        await server.start()
    assert time.monotonic() - t0 < 10


async def test_a_command_that_does_not_exist_fails_start_clearly():
    with pytest.raises(McpUnavailable, match="nope"):
        await McpServer(McpServerConfig(name="nope", command=["/nonexistent/mcp-server"])).start()


def test_config_validation():
    with pytest.raises(ValidationError, match="stdio needs a command"):
        McpServerConfig(name="a")
    with pytest.raises(ValidationError, match="needs an http"):
        McpServerConfig(name="a", transport="http")
    with pytest.raises(ValidationError, match="for transport stdio"):
        McpServerConfig(name="a", transport="http", url="http://127.0.0.1:1/mcp", command=["x"])
    with pytest.raises(ValidationError):
        McpServerConfig(name="a", command=["x"], scope="process")
    with pytest.raises(ValidationError, match="used twice"):
        ToolsConfig(mcp=[{"name": "a", "command": ["x"]}, {"name": "a", "command": ["y"]}])


async def test_sandbox_without_bubblewrap_is_a_clear_error(monkeypatch):
    from shared.runtime import sandbox

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(Exception, match="bubblewrap is not installed"):
        await McpServer(stdio_cfg(sandbox=True)).start()


async def test_sandboxed_stdio_server_works():  # bubblewrap, as the python tool's tests need it
    repo = str(HERE.parents[1])
    server = McpServer(stdio_cfg(sandbox=True, cwd=repo))
    try:
        reg = ToolRegistry(await server.start(), timeout_s=10)
        assert (await call(reg, "ex.add", a=1, b=2)).text == "3"
    finally:
        await server.close()


# --- streamable HTTP ---------------------------------------------------------------------------------------
async def test_http_server_with_bearer_token(http_server):
    url, token = http_server
    server = McpServer(McpServerConfig(name="web", transport="http", url=url, token_file=str(token)))
    try:
        reg = ToolRegistry(await server.start(), timeout_s=10)
        assert "web.add" in reg.tools
        assert (await call(reg, "web.add", a=20, b=22)).text == "42"
        bad = await call(reg, "web.fail", reason="nope")
        assert not bad.ok and "refused: nope" in bad.text
    finally:
        await server.close()


async def test_http_server_refuses_a_wrong_token_and_loose_token_files_are_refused(http_server, tmp_path):
    url, _ = http_server
    wrong = tmp_path / "wrong"
    wrong.write_text("nope")
    wrong.chmod(0o600)
    with pytest.raises(McpUnavailable, match="web"):
        await McpServer(McpServerConfig(name="web", transport="http", url=url, token_file=str(wrong),
                                        connect_timeout_s=5)).start()
    wrong.chmod(0o644)
    with pytest.raises(SecretFileError, match="readable by others"):
        await McpServer(McpServerConfig(name="web", transport="http", url=url, token_file=str(wrong))).start()


async def test_an_unreachable_http_server_fails_start():
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(McpUnavailable):
        await McpServer(McpServerConfig(name="gone", transport="http", url=url, connect_timeout_s=3)).start()


# --- with the registry builder, the workflow and the worker ------------------------------------------------
async def test_start_mcp_tools_adds_to_the_builtin_registry_and_refuses_clashes():
    cfg = ToolsConfig(enabled=["calculator"], mcp=[stdio_cfg().model_dump()])
    reg = build_tools(cfg)
    close = await start_mcp_tools(cfg, reg)
    try:
        assert list(reg.tools) == ["calculator", "ex.add", "ex.echo", "ex.fail", "ex.pid", "ex.instance"]
    finally:
        await close()
    clash = ToolsConfig(enabled=["calculator"], mcp=[stdio_cfg(tool_prefix="", args=[]).model_dump()])
    reg = build_tools(clash)
    reg.add(type("T", (), {"name": "add", "description": "", "parameters": {}})())
    with pytest.raises(ValueError, match="already registered"):
        await start_mcp_tools(clash, reg)


async def test_tool_agent_workflow_calls_an_mcp_tool():
    tok = char_tokenizer()
    call_text = '<tool_call>{"name": "ex.add", "arguments": {"a": 6, "b": 36}}</tool_call>'
    eng = ScriptedEngine(tok, lambda p, n: "42" if "</tool_response>" in p else call_text)
    server = McpServer(stdio_cfg())
    try:
        reg = ToolRegistry(await server.start(), timeout_s=10)
        cfg = JetrlConfig.model_validate({"reward": {"task": "maxdigit"},
                                          "rollout": {"sampling": {"max_new_tokens": 256}}})
        ctx = WorkflowContext(engine=eng, tokenizer=tok, reward=MaxDigitReward(), tools=reg, cfg=cfg)
        task = PromptTask(run="r1", prompt_id="p1", epoch=0, payload={"prompt": "6+36?", "reference": "42"},
                          group_size=1)
        s = (await ToolAgentWorkflow().run(ctx, task))[0]
    finally:
        await server.close()
    prompt = tok.decode(s.tokens[: s.prompt_len].tolist())
    assert "ex.add(a, b): Add two integers." in prompt
    assert "<tool_response>\n42\n</tool_response>" in tok.decode(s.tokens.tolist())
    assert s.reward == 1.0 and s.metrics["tool_calls"] == 1 and s.metrics["tool_errors"] == 0


@pytest.mark.parametrize("given", [False, True], ids=["built-by-worker", "given-by-cli"])
async def test_rollout_worker_starts_and_closes_mcp_servers(nats_config, given):
    from rollout_service.service import RolloutWorker

    tok = char_tokenizer()
    cfg = worker_config(nats_config.servers[0], "r1", workflow="tool_agent",
                        tools={"enabled": ["calculator"], "mcp": [stdio_cfg().model_dump()]})
    cfg.rollout.service.follow_weights = False
    tools = build_tools(cfg.rollout.tools) if given else None  # `jetrl rollout` builds the registry first
    worker = RolloutWorker(cfg, engine=ScriptedEngine(tok, lambda p, n: "x"), tokenizer=tok, tools=tools,
                           instance="w")
    await worker.start()
    try:
        assert {"calculator", "ex.add"} <= set(worker.tools.tools)
        pid = int((await worker.tools.call(ToolCall("ex.pid", {}))).text)
    finally:
        await asyncio.wait_for(worker.close(), 30)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not _alive(pid), "the MCP server outlived the worker"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes (its parent, the test process, reaps it when asyncio does)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


async def test_a_pool_of_workers_starts_one_mcp_server_for_all_of_them(nats_config):
    from rollout_service.pool import WorkerPool

    tok = char_tokenizer()
    cfg = worker_config(nats_config.servers[0], "r1", workflow="tool_agent",
                        tools={"enabled": ["calculator"], "mcp": [stdio_cfg().model_dump()]})
    cfg.rollout.service.follow_weights = False
    pool = WorkerPool(cfg, 3, instance="p", tokenizer=tok, engine_factory=lambda: ScriptedEngine(tok, lambda p, n: "x"))
    await pool.start()
    try:
        assert len({id(w.tools) for w in pool.workers}) == 1 and "ex.add" in pool.tools.tools
        pids = {int((await w.tools.call(ToolCall("ex.pid", {}))).text) for w in pool.workers}
        assert len(pids) == 1  # one server process for the three workers
    finally:
        await asyncio.wait_for(pool.close(), 30)
    pid = pids.pop()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not _alive(pid), "the MCP server outlived the pool"


async def test_an_allow_list_offers_only_the_named_tools_and_a_missing_one_fails_start():
    cfg = ToolsConfig(enabled=[], mcp=[stdio_cfg(tools=["add", "echo"]).model_dump()])
    reg = build_tools(cfg)
    close = await start_mcp_tools(cfg, reg)
    try:
        assert list(reg.tools) == ["ex.add", "ex.echo"]
    finally:
        await close()
    bad = ToolsConfig(enabled=[], mcp=[stdio_cfg(tools=["add", "nope"]).model_dump()])
    with pytest.raises(McpUnavailable, match="lists no tool 'nope'"):
        await start_mcp_tools(bad, build_tools(bad))


async def test_episode_scope_gives_each_episode_its_own_server_closed_when_it_ends():
    cfg = ToolsConfig(enabled=["calculator"], mcp=[stdio_cfg(scope="episode").model_dump()])
    reg = build_tools(cfg)
    close = await start_mcp_tools(cfg, reg)  # started once to check it and list its tools, then closed
    try:
        assert list(reg.tools) == ["calculator"] and len(reg.episode_starters) == 1
        async with reg.episode() as a, reg.episode() as b:  # two episodes at once
            assert set(a.tools) == set(b.tools) == {"calculator", "ex.add", "ex.echo", "ex.fail", "ex.pid", "ex.instance"}
            pa, pb = [int((await r.call(ToolCall("ex.pid", {}))).text) for r in (a, b)]
            assert pa != pb and _alive(pa) and _alive(pb)
            assert (await a.call(ToolCall("calculator", {"expression": "2*3"}))).text == "6"
        deadline = time.monotonic() + 10
        while (_alive(pa) or _alive(pb)) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not _alive(pa) and not _alive(pb), "an episode's MCP server outlived its episode"
        assert "ex.pid" not in reg.tools  # the worker's registry never holds them
    finally:
        await close()


async def test_tool_choice_required_makes_the_first_turn_a_valid_call_of_an_offered_tool(tmp_path):
    """A tiny random policy in the local engine: its first turn is forced to a schema-valid call, which the
    MCP server answers; later turns are free."""
    import json

    from rollout_service.engines.local import LocalEngine

    cfg = JetrlConfig.model_validate({"reward": {"task": "maxdigit"}, "model": {"path": str(pol := char_policy(tmp_path)),
                                                                          "tokenizer": str(pol / "tokenizer")},
                                      "rollout": {"sampling": {"max_new_tokens": 160, "seed": 0},
                                                  "tool_agent": {"tool_choice": "required", "max_turns": 2}}})
    engine = LocalEngine(cfg)
    await engine.start()
    # add's integers end soon under a random policy; a free string (echo) would run on to max_new_tokens
    server = McpServer(stdio_cfg(tools=["add", "pid"]))
    try:
        reg = ToolRegistry(await server.start(), timeout_s=10)
        ctx = WorkflowContext(engine=engine, tokenizer=engine.tokenizer, reward=MaxDigitReward(), tools=reg, cfg=cfg)
        task = PromptTask(run="r1", prompt_id="p1", epoch=0, payload={"prompt": "1 2 3 =", "reference": "3"},
                          group_size=3)
        samples = await ToolAgentWorkflow().run(ctx, task)
    finally:
        await server.close()
        await engine.close()
    tok = engine.tokenizer
    for s in samples:
        text = tok.decode(s.tokens[s.prompt_len:].tolist())
        assert text.startswith("<tool_call>"), text[:200]
        call_ = json.loads(text[len("<tool_call>"): text.index("</tool_call>")])
        assert call_["name"] in ("ex.add", "ex.pid") and s.metrics["tool_calls"] == 1
        assert s.metrics["tool_errors"] == 0, text
        if call_["name"] == "ex.add":  # what the server answers to that call
            want = str(call_["arguments"]["a"] + call_["arguments"]["b"])
            assert f"<tool_response>\n{want}\n</tool_response>" in text
