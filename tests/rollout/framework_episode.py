"""One episode of a framework example agent (examples/agents/frameworks*), picked by the task's
`metadata.agent`, so that one rollout worker runs every framework in tests/rollout/test_agent_frameworks.py.
Started by the worker as the episode's command (OPENAI_BASE_URL etc. in its environment, the task on stdin),
it runs the example with the same environment and the same stdin line and exits with its exit code."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = ROOT / "examples" / "agents" / "frameworks"
NODE = ROOT / "examples" / "agents" / "frameworks-node"

# variant name -> the command a user would put in rollout.workflow_args.command
VARIANTS = {
    "openai-agents": [sys.executable, PY / "openai_agents_sdk.py"],
    "openai-agents-chat": [sys.executable, PY / "openai_agents_sdk.py", "--chat-completions"],
    "langgraph": [sys.executable, PY / "langgraph_agent.py"],
    "langgraph-stream": [sys.executable, PY / "langgraph_agent.py", "--stream"],
    "smolagents": [sys.executable, PY / "smolagents_agent.py"],
    "pydantic-ai": [sys.executable, PY / "pydantic_ai_agent.py"],
    "dspy": [sys.executable, PY / "dspy_agent.py"],
    "anthropic": [sys.executable, PY / "anthropic_agent.py"],
    "openai-agents-js": ["node", NODE / "openai_agents.mjs"],
    "vercel-generate": ["node", NODE / "vercel_ai.mjs"],
    "vercel-stream": ["node", NODE / "vercel_ai.mjs", "--stream"],
}

if __name__ == "__main__":
    line = sys.stdin.readline()
    argv = [str(a) for a in VARIANTS[json.loads(line)["metadata"]["agent"]]]
    if argv[0] == "node":
        argv[0] = shutil.which("node") or "node"
    sys.exit(subprocess.run(argv, input=line, text=True).returncode)
