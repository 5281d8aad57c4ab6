"""Find a workflow class by name: a built-in (single_turn, multi_turn, tool_agent, agent) or a user's
'package.module:Class' (or 'path/to/file.py:Class'). Errors say what to fix, at worker start-up."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Any

from rollout_service.workflows.base import Workflow


class WorkflowLoadError(ValueError):
    """rollout.workflow names nothing loadable; the message says why and what was tried."""


def builtin_workflows() -> dict[str, type]:
    from rollout_service.workflows.agent import AgentWorkflow
    from rollout_service.workflows.multi_turn import MultiTurnWorkflow
    from rollout_service.workflows.single_turn import SingleTurnWorkflow
    from rollout_service.workflows.tool_agent import ToolAgentWorkflow

    return {c.name: c for c in (SingleTurnWorkflow, MultiTurnWorkflow, ToolAgentWorkflow, AgentWorkflow)}


def _import_module(mod_name: str, spec: str):
    if mod_name.endswith(".py") or "/" in mod_name:
        path = Path(mod_name)
        if not path.is_file():
            raise WorkflowLoadError(f"rollout.workflow={spec!r}: file {path} does not exist")
        module_spec = importlib.util.spec_from_file_location(f"jetrl_user_workflow_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module
    # Like uvicorn/gunicorn: modules beside the working directory are importable.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        if exc.name and mod_name.startswith(exc.name):
            raise WorkflowLoadError(
                f"rollout.workflow={spec!r}: no module named {exc.name!r} (searched the working directory "
                f"{os.getcwd()} and the installed packages; check the spelling or install the package)"
            ) from None
        raise WorkflowLoadError(f"rollout.workflow={spec!r}: module {mod_name!r} failed to import: {exc}") from exc
    except Exception as exc:
        raise WorkflowLoadError(
            f"rollout.workflow={spec!r}: importing {mod_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc


def load_workflow_class(spec: str) -> type:
    builtins = builtin_workflows()
    if spec in builtins:
        return builtins[spec]
    if ":" not in spec:
        raise WorkflowLoadError(
            f"rollout.workflow={spec!r}: not a built-in workflow ({', '.join(builtins)}) and not an import path "
            f"'package.module:Class'"
        )
    mod_name, _, attr = spec.rpartition(":")
    if not mod_name or not attr:
        raise WorkflowLoadError(f"rollout.workflow={spec!r}: write it as 'package.module:Class'")
    module = _import_module(mod_name, spec)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(module) if not n.startswith("_"))
            raise WorkflowLoadError(f"rollout.workflow={spec!r}: {mod_name} has no attribute {attr!r} "
                                    f"(it defines: {', '.join(names) or 'nothing'})")
        obj = getattr(obj, part)
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
