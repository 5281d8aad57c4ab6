"""Built-in agent tools (calculator, sandboxed Python, local-corpus search) and the registry."""

from __future__ import annotations

from rollout_service.tools.base import Tool, ToolCall, ToolError, ToolOutcome, ToolRegistry
from rollout_service.tools.calculator import Calculator
from rollout_service.tools.python_sandbox import PythonSandbox
from rollout_service.tools.search import CorpusSearch
from shared.config.workflows import ToolsConfig

BUILTIN_TOOLS = ("calculator", "python", "search")


def build_tools(cfg: ToolsConfig) -> ToolRegistry:
    """The registry of `cfg.enabled` tools. `search` is skipped when no corpus is configured."""
    reg = ToolRegistry(timeout_s=cfg.timeout_s, max_output_chars=cfg.max_output_chars)
    for name in cfg.enabled:
        if name == "calculator":
            reg.add(Calculator())
        elif name == "python":
            # Cut off by the registry's time limit too: cancellation kills and reaps the process group.
            reg.add(PythonSandbox(timeout_s=cfg.timeout_s, memory_mb=cfg.python_memory_mb, cpu_s=cfg.python_cpu_s,
                                  output_bytes=cfg.python_output_bytes))
        elif name == "search":
            if cfg.corpus:
                reg.add(CorpusSearch(cfg.corpus, top_k=cfg.search_top_k))
        else:
            raise ValueError(f"rollout.tools.enabled: unknown tool {name!r} (built-in: {', '.join(BUILTIN_TOOLS)})")
    return reg


__all__ = ["BUILTIN_TOOLS", "Calculator", "CorpusSearch", "PythonSandbox", "Tool", "ToolCall", "ToolError",
           "ToolOutcome", "ToolRegistry", "build_tools"]
