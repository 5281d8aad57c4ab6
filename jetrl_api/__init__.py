"""jetrl's front door for users' code: the few classes and functions a user extends or calls, in one place.

    from jetrl_api import Workflow, WorkflowContext, PromptTask, Sample     # a rollout workflow
    from jetrl_api import Tool, ToolError                                   # a tool for tool_agent
    from jetrl_api import Score, ScorerFn                                   # a reward scorer
    from jetrl_api import serve_agent                                       # an agent as a NATS service
    from jetrl_api import Engine, GenerateRequest, GenerateResult, SamplingParams   # an inference engine
    from jetrl_api import load_ref                                          # 'package.module:name'

Where each is named in config:
- a workflow: `rollout.workflow: "my_pkg.flows:MyWorkflow"` — a subclass of Workflow with
  `async def run(self, ctx, task) -> list[Sample]` (docs/workflows.md);
- an agent: `rollout.workflow: agent` with `workflow_args.entry: "my_pkg.agent:run"`, an
  `async def run(client, task) -> float | None` given an openai.AsyncOpenAI client; or a long-running
  agent service started with serve_agent (docs/agents.md);
- a scorer: `reward.scorer: "my_pkg.rewards:score"`, a ScorerFn `fn(completion, reference, payload)`
  returning a number, (number, metrics) or a Score (docs/reward.md);
- a tool: a class with `name`, `description`, `parameters` and `async def run(args) -> str` (the Tool
  protocol), registered on a ToolRegistry (docs/workflows.md, "Tools").

Every loader of such a reference (workflow, entry, scorer) goes through load_ref, so each takes
'package.module:name' or 'path/to/file.py:name' and names the setting in its errors.

This package re-exports only; nothing in the services imports it (tests/shared/test_import_wall.py).
"""

from __future__ import annotations

from reward_service.scorers import Score, ScorerFn
from rollout_service.agents.agent_service import serve_agent
from rollout_service.engines.base import Engine, GenerateRequest, GenerateResult, SamplingParams
from rollout_service.tools.base import Tool, ToolError, ToolRegistry
from rollout_service.workflows.base import (
    Trace,
    Workflow,
    WorkflowContext,
    WorkflowLoadError,
    prompt_messages,
)
from shared.contract.messages import PromptTask, Sample
from shared.runtime.refs import RefError, load_ref

__all__ = [
    "Engine", "GenerateRequest", "GenerateResult", "PromptTask", "RefError", "Sample", "SamplingParams", "Score",
    "ScorerFn", "Tool", "ToolError", "ToolRegistry", "Trace", "Workflow", "WorkflowContext", "WorkflowLoadError",
    "load_ref", "prompt_messages", "serve_agent",
]
