"""Agent workflows: how one prompt task becomes the samples of one group (docs/workflows.md)."""

from rollout_service.workflows.base import Trace, Workflow, WorkflowContext, WorkflowStats, prompt_messages
from rollout_service.workflows.loader import WorkflowLoadError, builtin_workflows, load_workflow

__all__ = ["Trace", "Workflow", "WorkflowContext", "WorkflowLoadError", "WorkflowStats", "builtin_workflows",
           "load_workflow", "prompt_messages"]
