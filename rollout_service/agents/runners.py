"""Where an agent runs for one episode.

EntryRunner    `async def run(client: openai.AsyncOpenAI, task: dict, **args) -> float | None`, imported from
               'package.module:function' (or 'path/to/file.py:function'), called in the worker with
               workflow_args.args as keyword arguments (an adapter's settings); its
               client calls the endpoint's app in-process (rollout.agent.entry_transport) or over HTTP.
CommandRunner  an external command, any language: started per episode with OPENAI_BASE_URL,
               OPENAI_API_KEY (the session's key), ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY (the same
               endpoint and key, for Anthropic's SDKs), JETRL_SESSION_ID and JETRL_REWARD_URL in its
               environment and the task (JSON) on stdin; the episode ends when it exits (0).
ServiceRunner  a long-running agent service, any language: each episode is a NATS request (JSON) on
               `jetrl.<run>.agents.<name>` (queue group jetrl-agents); the reply ends it.

Either returns the reward the agent gave (or None) and raises EpisodeError when the agent fails. The
caller bounds the time (rollout.agent.timeout_s); a cancelled CommandRunner kills the command's whole
process group, and a worker that dies (even SIGKILLed) takes that group with it (reaper.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import shlex
import signal
import sys
from typing import Any

from rollout_service.agents.session import EpisodeError, Session, SessionStore
from rollout_service.workflows.base import WorkflowLoadError
from shared.runtime.refs import load_ref


def task_json(task) -> dict[str, Any]:
    """What an agent is given: the prompt task's payload (prompt or messages, reference, metadata) and ids."""
    return {"prompt_id": task.prompt_id, "epoch": task.epoch, "run": task.run, **dict(task.payload)}


def load_entry(spec: str):
    """The `async def run(client, task)` function named by 'package.module:function'."""
    fn = load_ref(spec, "rollout.workflow_args.entry", WorkflowLoadError)
    attr = spec.rpartition(":")[2]
    if not inspect.iscoroutinefunction(fn):
        raise WorkflowLoadError(f"rollout.workflow_args.entry={spec!r}: {attr} must be `async def run(client, task)`")
    return fn


def episode_request(session: Session, store: SessionStore) -> dict[str, Any]:
    """What an agent is told about its episode (the command's environment, the service's request)."""
    url = store.url(session)
    return {"base_url": url, "api_key": session.key, "session_id": session.id,
            "reward_url": url[: -len("/v1")] + "/reward", "task": task_json(session.task)}


def _reward(value: Any, who: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EpisodeError(f"{who} returned {type(value).__name__} {value!r}, not a float or None")
    return float(value)


class EntryRunner:
    def __init__(self, spec: str, args: dict | None = None):
        self.spec = spec
        self.fn = load_entry(spec)
        self.args = dict(args or {})
        if self.args:
            try:
                inspect.signature(self.fn).bind(None, None, **self.args)
            except TypeError as exc:
                raise WorkflowLoadError(f"rollout.workflow_args.args do not fit {spec}: {exc}") from None
        try:
            import openai  # at start-up: a first import inside an episode would eat its time limit
        except ImportError:
            raise WorkflowLoadError(f"rollout.workflow_args.entry={spec!r}: an entry agent gets an "
                                    "openai.AsyncOpenAI client; install it: pip install 'jetrl[agents]'") from None
        self.openai = openai
        self._http = None  # one connection pool for every episode's client (a client per episode is cheap then)
        # openai looks up the OS for its X-Stainless-OS header in a worker thread at a client's first request;
        # with a client per episode that thread hop came back at a different time for each episode and set
        # episodes that started together a decode step apart for the rest of their calls (bench/agent_endpoint.py:
        # 16 vs 8 prefills, 256 vs 248 steps). Looked up once here and given to every episode's client.
        self._platform = None
        with contextlib.suppress(Exception):
            from openai._base_client import get_platform

            self._platform = get_platform()

    async def __call__(self, session: Session, store: SessionStore) -> float | None:
        if self._http is None:
            import httpx

            if store.app is not None:  # rollout.agent.entry_transport: in_process
                # the endpoint's own app, called in this task: same routes and checks, no socket or HTTP parsing
                # (on a 2-core box that is ~6 % of an agent's episode rate, bench/agent_endpoint.py); an app
                # error comes back as the 500 an HTTP client would get
                transport = httpx.ASGITransport(app=store.app, raise_app_exceptions=False)
                self._http = httpx.AsyncClient(transport=transport, timeout=None)
            else:
                self._http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0),
                                               limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        client = self.openai.AsyncOpenAI(base_url=store.url(session), api_key=session.key, max_retries=0,
                                         http_client=self._http)
        if self._platform is not None and getattr(client, "_platform", 0) is None:
            client._platform = self._platform  # see __init__
        try:
            value = await self.fn(client, task_json(session.task), **self.args)
        except EpisodeError:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise EpisodeError(f"agent {self.spec} raised {type(exc).__name__}: {exc}") from None
        return _reward(value, f"agent {self.spec}")

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None


class CommandRunner:
    def __init__(self, command: str | list[str], stderr_tail: int = 2000):
        self.argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        if not self.argv:
            raise WorkflowLoadError("rollout.workflow_args.command is empty")
        self.tail = stderr_tail

    async def __call__(self, session: Session, store: SessionStore) -> float | None:
        ep = episode_request(session, store)
        env = dict(os.environ, OPENAI_BASE_URL=ep["base_url"], OPENAI_API_KEY=ep["api_key"],
                   # the Anthropic SDKs add /v1/messages to their base URL themselves
                   ANTHROPIC_BASE_URL=ep["base_url"].removesuffix("/v1"), ANTHROPIC_API_KEY=ep["api_key"],
                   JETRL_SESSION_ID=ep["session_id"], JETRL_REWARD_URL=ep["reward_url"])
        try:  # through the reaper: the command and its children die with this worker, even SIGKILLed
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "rollout_service.agents.reaper", str(os.getpid()), *self.argv,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
        except OSError as exc:
            raise EpisodeError(f"agent command {self.argv[0]!r} could not start: {exc}") from None
        try:
            proc.stdin.write(json.dumps(task_json(session.task)).encode() + b"\n")
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await proc.stdin.drain()
            proc.stdin.close()
            err = bytearray()
            while chunk := await proc.stderr.read(65536):  # keep the tail only: a chatty agent cannot fill memory
                err += chunk
                del err[: max(0, len(err) - self.tail)]
            rc = await proc.wait()
        finally:
            if proc.returncode is None:  # cancelled (time-out): the agent and everything it started go
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(proc.wait(), 5)
        if rc != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-5:]
            raise EpisodeError(f"agent command exited with code {rc}" + (f": {' | '.join(tail)}" if tail else ""))
        return None


class ServiceRunner:
    """An episode is one request on `jetrl.<run>.agents.<name>`: JSON {"base_url", "api_key", "session_id",
    "reward_url", "task"}; the reply, JSON {"reward": float | null} or {"error": "..."}, ends it. The caller's
    time limit is the request's; `nc` (the worker's NATS connection) is set before the first episode."""

    def __init__(self, name: str, run: str):
        from shared.contract import subjects

        try:
            self.subject = subjects.agent_episodes(run, name)
        except ValueError as exc:
            raise WorkflowLoadError(f"rollout.workflow_args.service={name!r}: {exc}") from None
        self.nc = None

    async def __call__(self, session: Session, store: SessionStore) -> float | None:
        import nats.errors

        try:
            msg = await self.nc.request(self.subject, json.dumps(episode_request(session, store)).encode(),
                                        timeout=1e9)  # bounded by the caller's rollout.agent.timeout_s
        except nats.errors.NoRespondersError:
            raise EpisodeError(f"no agent service answers on {self.subject}") from None
        try:
            reply = json.loads(msg.data)
        except ValueError:
            raise EpisodeError(f"agent service on {self.subject} replied with something that is not JSON: "
                               f"{msg.data[:200]!r}") from None
        if not isinstance(reply, dict):
            raise EpisodeError(f"agent service on {self.subject} replied {reply!r}, not a JSON object")
        if reply.get("error"):
            raise EpisodeError(f"agent service on {self.subject}: {str(reply['error'])[:2000]}")
        return _reward(reply.get("reward"), f"agent service on {self.subject}")
