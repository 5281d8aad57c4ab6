"""Built-in tools and the registry: real subprocesses for the Python sandbox, a real corpus on disk."""

from __future__ import annotations

import asyncio
import json

import pytest

from rollout_service.tools import (
    Calculator,
    CorpusSearch,
    PythonSandbox,
    ToolCall,
    ToolError,
    ToolRegistry,
    build_tools,
)
from rollout_service.tools.calculator import evaluate
from rollout_service.workflows.tool_agent import parse_tool_calls
from shared.config.workflows import ToolsConfig


def test_calculator_evaluates_arithmetic_by_hand_values():
    assert evaluate("(3 + 4) * 2") == 14
    assert evaluate("7 // 2 + 7 % 2") == 4
    assert evaluate("2 ** 10") == 1024
    assert evaluate("-sqrt(16) + abs(-3)") == -1.0
    assert evaluate("max(3, 8, 1)") == 8


@pytest.mark.parametrize("expr, message", [
    ("__import__('os')", "not allowed"),
    ("1 / 0", "division by zero"),
    ("9 ** 99999", "exponent"),
    ("3 +", "cannot parse"),
    ("'a' * 3", "not allowed"),
])
def test_calculator_refuses_what_is_not_arithmetic(expr, message):
    with pytest.raises(ToolError, match=message):
        evaluate(expr)


async def test_calculator_tool_prints_integral_floats_as_ints():
    assert await Calculator().run({"expression": "10 / 2"}) == "5"


async def test_python_sandbox_returns_stdout_and_errors():
    tool = PythonSandbox(timeout_s=20)
    assert (await tool.run({"code": "print(6 * 7)"})).strip() == "42"
    out = await tool.run({"code": "raise ValueError('boom')"})
    assert "ValueError: boom" in out and "exit code 1" in out


async def test_python_sandbox_kills_a_program_that_hangs_at_its_time_limit():
    tool = PythonSandbox(timeout_s=1.0, cpu_s=30)
    with pytest.raises(ToolError, match="time limit"):
        await tool.run({"code": "import time\nwhile True: time.sleep(0.1)"})


async def test_python_sandbox_memory_limit_stops_a_big_allocation():
    tool = PythonSandbox(timeout_s=30, memory_mb=64)
    out = await tool.run({"code": "x = bytearray(512 * 1024 * 1024)\nprint('allocated')"})
    assert "allocated" not in out and "MemoryError" in out


async def test_python_sandbox_runs_isolated_in_an_empty_dir():
    out = await PythonSandbox(timeout_s=20).run({"code": "import os\nprint(os.listdir('.'), 'JETRL' in str(os.environ))"})
    assert "['main.py'] False" in out


async def test_search_finds_the_passage_about_the_query(tmp_path):
    (tmp_path / "a.txt").write_text("The capital of France is Paris.\n\nBananas are yellow fruit.")
    (tmp_path / "b.md").write_text("Mount Everest is the highest mountain on Earth.")
    tool = CorpusSearch(tmp_path, top_k=1)
    assert "Everest" in await tool.run({"query": "highest mountain"})
    assert "Paris" in await tool.run({"query": "capital France"})
    assert await tool.run({"query": "zzz"}) == "no results"


def test_search_reads_jsonl_and_names_a_bad_line(tmp_path):
    good = tmp_path / "c.jsonl"
    good.write_text(json.dumps({"title": "t", "text": "hello world"}) + "\n")
    assert len(CorpusSearch(good).index.passages) == 1
    bad = tmp_path / "d.jsonl"
    bad.write_text('{"title": "x"}\n')
    with pytest.raises(ValueError, match=r"d.jsonl:1: .*'text'"):
        CorpusSearch(bad)


class Sleeper:
    name = "sleeper"
    description = "sleeps"
    parameters = {"type": "object", "properties": {}}

    async def run(self, args):
        await asyncio.sleep(3600)


class Crasher:
    name = "crasher"
    description = "raises"
    parameters = {"type": "object", "properties": {}}

    async def run(self, args):
        raise RuntimeError("internal bug")


async def test_registry_cuts_off_a_hanging_tool_at_its_limit():
    reg = ToolRegistry([Sleeper()], timeout_s=0.3)
    out = await asyncio.wait_for(reg.call(ToolCall("sleeper", {})), 30)
    assert not out.ok and "timed out after 0.3 s" in out.text


async def test_registry_turns_every_failure_into_text_for_the_model():
    reg = ToolRegistry([Calculator(), Crasher()], max_output_chars=60)
    unknown = await reg.call(ToolCall("nope", {}))
    assert not unknown.ok and "unknown tool 'nope'" in unknown.text and "calculator" in unknown.text
    missing = await reg.call(ToolCall("calculator", {}))
    assert not missing.ok and "needs argument(s) expression" in missing.text
    extra = await reg.call(ToolCall("calculator", {"expression": "1", "x": 2}))
    assert not extra.ok and "no argument(s) x" in extra.text
    crash = await reg.call(ToolCall("crasher", {}))
    assert not crash.ok and "RuntimeError: internal bug" in crash.text
    ok = await reg.call(ToolCall("calculator", {"expression": "1+1"}))
    assert ok.ok and ok.text == "2"
    long = await reg.call(ToolCall("calculator", {"expression": "10 ** 99"}))
    assert long.text.startswith("1" + "0" * 59) and "truncated, 100 chars in all" in long.text


def test_build_tools_skips_search_without_corpus_and_rejects_unknown_names():
    assert sorted(build_tools(ToolsConfig()).tools) == ["calculator", "python"]
    with pytest.raises(ValueError, match="rollout.tools.enabled: unknown tool 'web'"):
        build_tools(ToolsConfig(enabled=["web"]))
    with pytest.raises(ValueError, match="rollout.tools.corpus"):
        build_tools(ToolsConfig(corpus="/nonexistent/corpus"))


def test_parse_tool_calls_reads_hermes_calls_and_explains_malformed_ones():
    text = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>'
            '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>')
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls] == [("calculator", {"expression": "2+2"}),
                                                     ("python", {"code": "print(1)"})]
    bad = parse_tool_calls('<tool_call>{"name": calculator}</tool_call>')
    assert len(bad) == 1 and isinstance(bad[0], str) and "not valid JSON" in bad[0]
    assert "string 'name'" in parse_tool_calls("<tool_call>[1, 2]</tool_call>")[0]
    assert "must be a JSON object" in parse_tool_calls('<tool_call>{"name": "a", "arguments": 3}</tool_call>')[0]
    assert "not closed" in parse_tool_calls('<tool_call>{"name": "a"')[0]
    assert parse_tool_calls("the answer is 8") == []
