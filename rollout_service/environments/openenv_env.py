"""Train on an OpenEnv environment server unmodified (Meta / Hugging Face OpenEnv, `openenv-core` 0.3.0).

An entry agent for `rollout.workflow: agent` (docs/agents.md):

    rollout:
      workflow: agent
      workflow_args:
        entry: rollout_service.environments.openenv_env:run
        args: {url: "http://127.0.0.1:8765", max_turns: 5, action_field: guess,
               observation_template: "{message}"}

Per episode `run` opens its own session on the environment server with OpenEnv's own client
(`openenv.core.GenericEnvClient`: one WebSocket to `<url>/ws`; the server builds one environment instance
per connection and drops it when the connection closes, so concurrent episodes never share state), resets
it, and then, until the observation says `done` or `max_turns` replies were made: renders the observation as
a user message, asks the policy (`client.chat.completions.create(model="policy", ...)`: generated and
recorded by the rollout worker), turns the reply into an action and steps the environment. It returns the
episode's reward, from the environment's own step rewards.

Where the server is (the first that is set): the `url` argument; the task's `metadata.openenv_url` (a dataset
row may name its own server); the JETRL_OPENENV_URL environment variable of the rollout worker. http(s)://
and ws(s):// URLs are both accepted (OpenEnv's client turns http into ws and adds /ws).

Reset: `reset` (an argument: a dict for every episode) updated by the task's `metadata.reset` (a dict per
dataset row: {"seed": 17, ...}) is sent as the reset message's data. OpenEnv's server passes on only the keys
the environment's `reset()` accepts (all of them if it takes **kwargs) and silently drops the others.

Observation -> message: the observation's fields (OpenEnv sends an observation's own fields; its `reward`,
`done` and `metadata` are not among them) through `observation_template`, a str.format template over them
("{message}", "Board:\\n{board}\\nYour move?"); without one, a single field's value, else `name: value`
lines. The first user message is the task's prompt, a blank line and the reset observation; a task given as
`messages` keeps them and gets the observation as one more user message. `system_prompt` adds a system
message first.

Reply -> action (what is supported, exactly):
- action_format "text" (default): the reply, stripped, is the value of the action's field `action_field`
  (default "message"). With `action_pattern` (a regular expression) the value is its first match in the
  reply instead (group 1 if the pattern has groups); a reply it does not match is an invalid action.
- action_format "json": the reply holds one JSON object (alone, in a ```json fence, or the outermost
  {...} of the text) whose keys are the action's fields.
- `action_defaults` (a dict) are added to every action (the reply's own fields win in "json").
The value is sent as text (or as the JSON value); the environment's Action model (pydantic, lax) converts
it, e.g. "42" for an int field, and validates it on the server.

Invalid actions: a reply that the mapping cannot turn into an action, or whose action the server's Action
model rejects (VALIDATION_ERROR), is an invalid action: with invalid_action "feedback" (default) the
environment is not stepped, the reply stays in the transcript and `invalid_feedback` (with {error}) is the
next user message ({error} replaced by the error); the turn counts toward max_turns and earns no reward. With invalid_action "end" the
episode ends at once with reward 0. An exception raised by the environment's step() (EXECUTION_ERROR)
fails the episode (OpenEnvError: the group is dead-lettered with the message, rollout.agent.retry_failed
retries it), unless step_errors is "invalid": then it is handled as an invalid action (for environments
that raise on an illegal move).

Reward (`reward`): "last" (default; what OpenEnv's harness reports as the episode's reward, the last step
result's reward) = the reward of the last step the environment took; "sum" = the sum of every step's
reward. A step without a reward (None) counts 0; an episode that runs out of turns before `done` is scored
the same way (truncated, not failed).

Errors that fail the episode (OpenEnvError, with what to do): no URL; the server unreachable or not an
OpenEnv server; a reset error; the connection lost; no answer in message_timeout_s; no free session within
capacity_wait_s (the server's max_concurrent_envs is full: the adapter retries, so a server that allows one
session at a time serves the episodes one after another); an environment done at reset (nothing to train).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from typing import Any

try:
    # openenv.core imports its server side too (fastapi, fastmcp, gradio: ~3 s): here, at the worker's start
    # (rollout.workflow_args.entry is loaded then), not in the first episode's time
    from openenv.core import GenericEnvClient
    from websockets.exceptions import ConnectionClosed
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(f"rollout_service.environments.openenv_env needs openenv-core ({exc}): "
                      "pip install 'openenv-core==0.3.0'") from exc

URL_ENV = "JETRL_OPENENV_URL"
ACTION_FORMATS = ("text", "json")
REWARDS = ("last", "sum")
INVALID = ("feedback", "end")
STEP_ERRORS = ("fail", "invalid")
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


class OpenEnvError(RuntimeError):
    """The environment server could not play the episode; the message says why and what to do."""


class ServerError(Exception):
    """An error message from the server on the session's WebSocket ({"type": "error", "data": {...}})."""

    def __init__(self, data: dict):
        self.data = data if isinstance(data, dict) else {"message": str(data)}
        self.code = str(self.data.get("code", "UNKNOWN"))
        super().__init__(f"{self.data.get('message', 'unknown error')} (code {self.code})")

    def detail(self) -> str:
        """The message with pydantic's per-field errors, as the policy reads them back."""
        errors = self.data.get("errors")
        if isinstance(errors, list) and errors:
            parts = []
            for e in errors:
                if not isinstance(e, dict):
                    parts.append(str(e))
                    continue
                loc = ".".join(str(x) for x in e.get("loc") or ())
                parts.append(f"{loc}: {e.get('msg', '')}" if loc else str(e.get("msg", "")))
            return "; ".join(parts)
        return str(self.data.get("message", "unknown error"))


class _Client(GenericEnvClient):
    """OpenEnv's GenericEnvClient (WebSocket session, dict actions and observations, its result parsing),
    keeping the server's whole error message: the stock client raises RuntimeError with the message and
    code only, which drops a validation error's per-field details (what the policy is told). A server at
    capacity sends its CAPACITY_REACHED error and closes at once, often before the reset is sent: the error
    is then read from what the connection received before it closed."""

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            await self._send(message)
        except ConnectionClosed as closed:
            try:
                response = await self._receive()
            except Exception:
                raise closed from None
        else:
            response = await self._receive()
        if response.get("type") == "error":
            raise ServerError(response.get("data") or {})
        return response


def server_url(url: str, task: dict) -> str:
    meta = task.get("metadata") if isinstance(task.get("metadata"), dict) else {}
    for value in (url, meta.get("openenv_url"), os.environ.get(URL_ENV)):
        if isinstance(value, str) and value.strip():
            return value.strip().rstrip("/")
    raise OpenEnvError(f"no OpenEnv server URL: set rollout.workflow_args.args.url, the dataset row's "
                       f"metadata.openenv_url or the rollout worker's {URL_ENV}")


def render(observation: Any, template: str = "") -> str:
    """An observation (a dict of its fields) as the text of a user message."""
    if not isinstance(observation, dict):
        return str(observation)
    if template:
        try:
            return template.format_map(observation)
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise OpenEnvError(f"observation_template {template!r} does not fit the observation (fields "
                               f"{sorted(observation)}): {type(exc).__name__}: {exc}") from None
    fields = {k: v for k, v in observation.items() if v is not None}
    if len(fields) == 1:
        (value,) = fields.values()
        return value if isinstance(value, str) else json.dumps(value)
    return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v)}" for k, v in fields.items())


def _json_object(text: str) -> dict:
    candidates = [text.strip(), *(m.strip() for m in _FENCE.findall(text))]
    i, j = text.find("{"), text.rfind("}")
    if 0 <= i < j:
        candidates.append(text[i:j + 1])
    for c in candidates:
        try:
            value = json.loads(c)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    raise ValueError("the reply holds no JSON object with the action's fields")


def to_action(text: str, action_format: str = "text", action_field: str = "message", action_pattern: str = "",
              action_defaults: dict | None = None) -> dict:
    """The action (a dict of its fields) a reply maps to; ValueError (the message is the policy's feedback)
    when it maps to none."""
    defaults = dict(action_defaults or {})
    if action_format == "json":
        return {**defaults, **_json_object(text)}
    value = text.strip()
    if action_pattern:
        m = re.search(action_pattern, text, re.S)
        if m is None:
            raise ValueError(f"the reply does not match {action_pattern}")
        value = m.group(1) if m.re.groups else m.group(0)
    return {**defaults, action_field: value}


def _check(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise OpenEnvError(f"rollout.workflow_args.args.{name}={value!r}: one of {', '.join(allowed)}")


def _first_messages(task: dict, first_observation: str, system_prompt: str) -> list[dict]:
    msgs = [{"role": "system", "content": system_prompt}] if system_prompt else []
    if isinstance(task.get("messages"), list) and task["messages"]:
        msgs += [dict(m) for m in task["messages"]]
        return msgs + ([{"role": "user", "content": first_observation}] if first_observation else [])
    prompt = task.get("prompt") or ""
    text = f"{prompt}\n\n{first_observation}" if prompt and first_observation else prompt or first_observation
    return msgs + [{"role": "user", "content": text}]


async def _open(url: str, reset_kwargs: dict, connect_timeout_s: float, message_timeout_s: float,
                capacity_wait_s: float):
    """A connected session and its reset result; waits (backing off) while the server is at capacity."""
    deadline = time.monotonic() + capacity_wait_s
    delay = 0.05
    while True:
        env = _Client(base_url=url, connect_timeout_s=connect_timeout_s, message_timeout_s=message_timeout_s)
        try:
            await env.connect()
        except ConnectionError as exc:
            raise OpenEnvError(f"cannot reach the OpenEnv server at {url} ({exc}); start it (e.g. python -m "
                               f"examples.openenv_env.server --port N) or fix rollout.workflow_args.args.url / "
                               f"{URL_ENV}") from None
        try:
            return env, await env.reset(**reset_kwargs)
        except ServerError as exc:
            await env.close()
            if exc.code != "CAPACITY_REACHED":
                raise OpenEnvError(f"the OpenEnv server at {url} refused reset({reset_kwargs}): {exc.detail()} "
                                   f"(code {exc.code})") from None
            if time.monotonic() + delay > deadline:
                raise OpenEnvError(f"the OpenEnv server at {url} had no free session for {capacity_wait_s:g} s "
                                   f"({exc.detail()}): raise its max_concurrent_envs to at least the episodes that "
                                   "run at once (max_in_flight x group_size per rollout worker) or raise "
                                   "capacity_wait_s") from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        except BaseException as exc:
            await env.close()
            if isinstance(exc, Exception):
                raise _transport_error(url, "reset", exc) from None
            raise


def _transport_error(url: str, what: str, exc: Exception) -> OpenEnvError:
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return OpenEnvError(f"the OpenEnv server at {url} did not answer {what} within message_timeout_s")
    if isinstance(exc, OpenEnvError):
        return exc
    return OpenEnvError(f"the OpenEnv session at {url} failed during {what}: {type(exc).__name__}: {exc}")


async def run(client, task: dict, url: str = "", max_turns: int = 8, action_field: str = "message",
              action_format: str = "text", action_pattern: str = "", action_defaults: dict | None = None,
              observation_template: str = "", system_prompt: str = "", reward: str = "last",
              invalid_action: str = "feedback", invalid_feedback: str = "Invalid action: {error}",
              step_errors: str = "fail", reset: dict | None = None, max_tokens: int | None = None,
              connect_timeout_s: float = 10.0, message_timeout_s: float = 60.0,
              capacity_wait_s: float = 60.0) -> float:
    """One episode on the OpenEnv server (module docstring); returns its reward."""
    _check("action_format", action_format, ACTION_FORMATS)
    _check("reward", reward, REWARDS)
    _check("invalid_action", invalid_action, INVALID)
    _check("step_errors", step_errors, STEP_ERRORS)
    if max_turns < 1:
        raise OpenEnvError(f"rollout.workflow_args.args.max_turns={max_turns}: at least 1")
    if action_pattern:
        try:
            re.compile(action_pattern)
        except re.error as exc:
            raise OpenEnvError(f"rollout.workflow_args.args.action_pattern={action_pattern!r}: {exc}") from None
    where = server_url(url, task)
    meta = task.get("metadata") if isinstance(task.get("metadata"), dict) else {}
    row_reset = meta.get("reset") or {}
    if not isinstance(row_reset, dict) or not isinstance(reset or {}, dict):
        raise OpenEnvError("reset arguments (workflow_args.args.reset, the row's metadata.reset) must be objects")
    reset_kwargs = {**(reset or {}), **row_reset}
    extra = {"max_tokens": max_tokens} if max_tokens else {}

    env, result = await _open(where, reset_kwargs, connect_timeout_s, message_timeout_s, capacity_wait_s)
    try:
        if result.done:
            raise OpenEnvError(f"the environment at {where} was done at reset({reset_kwargs}): nothing to play")
        messages = _first_messages(task, render(result.observation, observation_template), system_prompt)
        rewards: list[float] = []
        for _ in range(max_turns):
            reply = await client.chat.completions.create(model="policy", messages=messages, **extra)
            text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
            try:
                action = to_action(text, action_format, action_field, action_pattern, action_defaults)
            except ValueError as exc:  # the mapping found no action in the reply
                problem = str(exc)
            else:
                try:
                    result = await env.step(action)
                except ServerError as exc:
                    if exc.code != "VALIDATION_ERROR" and not (exc.code == "EXECUTION_ERROR" and step_errors == "invalid"):
                        raise OpenEnvError(f"the environment at {where} failed a step with action {action}: "
                                           f"{exc.detail()} (code {exc.code})") from None
                    problem = exc.detail()
                except Exception as exc:
                    raise _transport_error(where, "step", exc) from None
                else:
                    rewards.append(float(result.reward) if result.reward is not None else 0.0)
                    if result.done:
                        break
                    messages.append({"role": "user", "content": render(result.observation, observation_template)})
                    continue
            if invalid_action == "end":
                return 0.0
            messages.append({"role": "user", "content": invalid_feedback.replace("{error}", problem)})
        if not rewards:
            return 0.0
        return rewards[-1] if reward == "last" else float(sum(rewards))
    finally:
        await env.close()
