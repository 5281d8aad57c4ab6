"""Find a workflow class by name: a built-in (single_turn, multi_turn, tool_agent, agent) or a user's
'package.module:Class' (or 'path/to/file.py:Class'). Errors say what to fix, at worker start-up."""

from __future__ import annotations

import inspect

from rollout_service.workflows.base import Workflow, WorkflowLoadError
from shared.runtime.refs import load_ref

__all__ = ["WorkflowLoadError", "builtin_workflows", "load_workflow", "load_workflow_class"]


def builtin_workflows() -> dict[str, type]:
    from rollout_service.workflows.agent import AgentWorkflow
    from rollout_service.workflows.multi_turn import MultiTurnWorkflow
    from rollout_service.workflows.single_turn import SingleTurnWorkflow
    from rollout_service.workflows.tool_agent import ToolAgentWorkflow

    return {c.name: c for c in (SingleTurnWorkflow, MultiTurnWorkflow, ToolAgentWorkflow, AgentWorkflow)}


def load_workflow_class(spec: str) -> type:
    builtins = builtin_workflows()
    if spec in builtins:
        return builtins[spec]
    if ":" not in spec:
        raise WorkflowLoadError(
            f"rollout.workflow={spec!r}: not a built-in workflow ({', '.join(builtins)}) and not an import path "
            f"'package.module:Class'"
        )
    obj = load_ref(spec, "rollout.workflow", WorkflowLoadError)
    attr = spec.rpartition(":")[2]
    if not inspect.isclass(obj):
        raise WorkflowLoadError(f"rollout.workflow={spec!r}: {attr} is a {type(obj).__name__}, not a class")
    run = getattr(obj, "run", None)
    if run is None or not inspect.iscoroutinefunction(run):
        raise WorkflowLoadError(f"rollout.workflow={spec!r}: {attr} needs `async def run(self, ctx, task)` "
                                f"returning list[Sample] (subclass rollout_service.workflows.Workflow)")
    if inspect.isabstract(obj):
        raise WorkflowLoadError(f"rollout.workflow={spec!r}: {attr} is abstract (implement `run`)")
    return obj


def load_workflow(spec: str, args: dict | None = None) -> Workflow:
    """An instance of the workflow `spec`, built with `args` (rollout.workflow_args)."""
    cls = load_workflow_class(spec)
    try:
        return cls(**(args or {}))
    except TypeError as exc:
        raise WorkflowLoadError(f"rollout.workflow_args do not fit {cls.__name__}: {exc}") from None
