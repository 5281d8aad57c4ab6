"""Train on a verifiers environment unmodified (the `verifiers` package, 0.2.x: prime-rl's environment library).

An entry agent for `rollout.workflow: agent` (docs/agents.md):

    rollout:
      workflow: agent
      workflow_args:
        entry: rollout_service.environments.verifiers_env:run
        args: {env: my-env, env_args: {num_train: 200}}

`env` names the environment: an installed environment module (`my-env` or `my_env`, found as
`vf.load_environment` finds it: the module `my_env`, whose `load_environment(**env_args)` builds it), or
"package.module:attr" (or "path/to/file.py:attr") naming a `vf.Environment` object or a factory called
with `env_args`. It is built once per rollout-worker process for each (env, env_args), in a thread (the
first episodes wait for it), and every episode reuses it.

Per episode `run` takes the environment's dataset row from the task (`metadata.verifiers`, as the
dataset rows written by `python -m rollout_service.environments.verifiers_data` carry it: prompt,
example_id, answer, info, task and any other column), runs the environment's own `rollout` with
verifiers' own chat-completions client wrapped around the episode's `openai.AsyncOpenAI` (model "policy":
every call is generated and recorded by the worker), scores the finished state with the environment's own
rubric (`rubric.score_rollout`, then `rubric.cleanup`) and returns the rubric's reward. `sampling_args`
update the environment's own `sampling_args`; leave out `temperature` (rollout.sampling sets it, and
`jetrl eval` makes it greedy) and keep `max_tokens` within rollout.service.max_new_tokens.

Supported: environments whose rollout talks to the model only through the client it is given, over
chat completions: `vf.SingleTurnEnv`, `vf.MultiTurnEnv` subclasses (their `env_response`, stop
conditions, `max_turns`), `vf.ToolEnv` / `vf.StatefulToolEnv` (the tools are Python functions run in the
worker; the endpoint turns the model's tool calls into OpenAI `tool_calls`), with their parsers and
rubrics (reward functions and weights; a function that raises scores 0, as verifiers does). A reply the
model leaves empty, a prompt grown past the context (verifiers' OverlongPromptError) or a malformed tool
call is the policy's doing: the episode ends as verifiers ends it and the rubric scores it. An error from
the endpoint (any other model-call error) or from infrastructure fails the episode with its message.

Not supported: rubrics with group reward functions (`states`, `completions`, ... arguments: rewards
relative to the group) or that provide advantages, since jetrl scores each episode on its own (refused
when the environment is loaded); environments that reach the model other than through the given client
(sandboxed CLI agents behind verifiers' interception server, an environment served with
`env.start_server`); the token and renderer clients (token ids come from the worker's recording anyway);
images. Only the reward comes back: the rubric's other metrics and per-step rewards are not recorded.
The environment's `rollout.agent.max_calls` must allow its `max_turns`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib.util
import json
import signal
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from shared.runtime.refs import load_ref

MODEL = "policy"
REQUIRED = ("prompt", "example_id")  # verifiers' RolloutInput needs these; answer, info, task are optional
INSTALL = "pip install 'verifiers==0.2.0'"


class VerifiersEnvError(RuntimeError):
    """The environment cannot be loaded or run, or a task row is not one of its dataset rows; says why."""


def _verifiers():
    try:
        import verifiers
    except ImportError:
        raise VerifiersEnvError(f"the verifiers package is not installed: {INSTALL}") from None
    return verifiers


@contextlib.contextmanager
def _keep_signal_handlers():
    """verifiers' Environment.__init__ installs SIGINT and SIGTERM handlers (teardown, then exit 143), which
    would replace the worker's graceful shutdown, and raises outside the main thread: they are skipped (while
    an environment is built, signal.signal leaves SIGINT and SIGTERM as they are, process-wide)."""
    real = signal.signal

    def keep(sig, handler):
        return signal.getsignal(sig) if sig in (signal.SIGINT, signal.SIGTERM) else real(sig, handler)

    signal.signal = keep
    try:
        yield
    finally:
        signal.signal = real


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing
        return False


def load_environment(env: str, env_args: dict | None = None):
    """The `vf.Environment` that `env` names, built with `env_args` (see the module docstring)."""
    vf = _verifiers()
    args = dict(env_args or {})
    with _keep_signal_handlers():
        if ":" in env:
            obj = load_ref(env, "verifiers env", VerifiersEnvError)
            if isinstance(obj, vf.Environment):
                if args:
                    raise VerifiersEnvError(
                        f"verifiers env {env!r} is an Environment object, not a factory: "
                        f"it takes no env_args (got {sorted(args)})"
                    )
                environment = obj
            elif callable(obj):
                environment = obj(**args)
            else:
                raise VerifiersEnvError(
                    f"verifiers env {env!r} is a {type(obj).__name__}, not a vf.Environment "
                    "or a function that builds one"
                )
        else:
            module = env.replace("-", "_").split("/")[-1]  # how vf.load_environment finds it
            if not _installed(module):
                raise VerifiersEnvError(
                    f"verifiers environment {env!r} is not installed: there is no module {module!r} (install "
                    "the environment's package, e.g. `pip install -e path/to/env` or `prime env install "
                    "OWNER/NAME`, or name an Environment as 'package.module:attr')"
                )
            environment = vf.load_environment(env, **args)
    if not isinstance(environment, vf.Environment):
        raise VerifiersEnvError(
            f"verifiers env {env!r} built a {type(environment).__name__}, not a vf.Environment"
        )
    if environment.requires_group_rollouts or environment.provides_advantages:
        raise VerifiersEnvError(
            f"verifiers env {env!r}: its rubric scores a group of rollouts together (group "
            "reward functions or advantages); jetrl scores each episode on its own, so only "
            "rubrics of per-rollout reward functions are supported"
        )
    return environment


_loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verifiers-env")
_lock = threading.Lock()
_loaded: dict[tuple[str, str], Future] = {}


def _load_once(key: tuple[str, str], env: str, env_args: dict | None):
    try:
        return load_environment(env, env_args)
    except BaseException:
        with _lock:  # not cached: the next episode tries again (and reports the error again)
            _loaded.pop(key, None)
        raise


async def environment_for(env: str, env_args: dict | None = None):
    """The environment for (env, env_args), built once per process in a thread; concurrent first episodes
    wait for the same build."""
    key = (env, json.dumps(env_args or {}, sort_keys=True, default=repr))
    with _lock:
        future = _loaded.get(key)
        if future is None:
            future = _loaded[key] = _loader.submit(_load_once, key, env, env_args)
    # shielded: an episode's time-out does not cancel the build the other episodes wait for
    return await asyncio.shield(asyncio.wrap_future(future))


def rollout_input(task: dict) -> dict:
    """The verifiers dataset row a task carries (`metadata.verifiers`), as the environment's rollout takes it."""
    where = f"task {task.get('prompt_id', '?')}"
    row = (task.get("metadata") or {}).get("verifiers")
    if not isinstance(row, dict):
        raise VerifiersEnvError(
            f"{where} has no metadata.verifiers (the environment's dataset row: prompt, example_id, answer, info, "
            "...); write the dataset with `python -m rollout_service.environments.verifiers_data --env ENV --out DIR`"
        )
    missing = [k for k in REQUIRED if row.get(k) is None]
    if missing:
        raise VerifiersEnvError(
            f"{where}: metadata.verifiers lacks {', '.join(missing)} (a verifiers rollout needs "
            f"{' and '.join(REQUIRED)}; it has {', '.join(sorted(row)) or 'nothing'})"
        )
    return copy.deepcopy(row)


def _check_state(env: str, state: Any, vf) -> None:
    """Raise when the rollout stopped on the endpoint's or the infrastructure's error, not the policy's."""
    err = state.get("error")
    if isinstance(err, vf.InvalidModelResponseError) or not isinstance(err, (vf.ModelError, vf.InfraError)):
        return  # none, or the policy's own (an empty reply, a tool call the environment could not run)
    cause = err.__cause__ or err
    raise VerifiersEnvError(
        f"verifiers env {env!r}: the rollout stopped on {type(err).__name__}: {type(cause).__name__}: {cause}"
    )


async def run(
    client, task: dict, env: str, env_args: dict | None = None, sampling_args: dict | None = None
) -> float:
    """One episode: the environment's rollout on the task's dataset row, scored by its rubric."""
    vf = _verifiers()
    from verifiers.clients import OpenAIChatCompletionsClient

    environment = await environment_for(env, env_args)
    row = rollout_input(task)
    args = {**copy.deepcopy(environment.sampling_args), **(sampling_args or {})}
    state = await environment.rollout(row, OpenAIChatCompletionsClient(client), MODEL, args)
    try:
        _check_state(env, state, vf)
        await environment.rubric.score_rollout(state)
    finally:
        await environment.rubric.cleanup(state)
    return float(state["reward"])
