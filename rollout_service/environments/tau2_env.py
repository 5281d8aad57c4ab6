"""Train on τ²-bench domains unmodified (sierra-research/tau2-bench, installed from its git repository: it is
not on PyPI, where `tau2` is an unrelated package).

An entry agent for `rollout.workflow: agent` (docs/agents.md):

    rollout:
      workflow: agent
      workflow_args:
        entry: rollout_service.environments.tau2_env:run
        args: {domain: airline, user: llm, user_model: Qwen/Qwen2.5-7B-Instruct,
               user_base_url: "http://127.0.0.1:8001/v1"}

Per episode `run` plays ONE τ²-bench simulation of the row's task (`metadata.tau2`: domain, task_set,
task_id, as the rows written by `python -m rollout_service.environments.tau2_data` carry them) with the
policy as the agent, and returns τ²-bench's own reward for it. Everything but the agent's LLM is τ²-bench's:
the task is looked up by id in the domain's task set (τ²-bench's registry and loaders), the environment is
`tau2.runner.build_environment(domain)`, the simulation is τ²-bench's half-duplex `Orchestrator`, run and
scored by `tau2.runner.run_simulation` (its `evaluate_simulation` with EvaluationType.ALL: the DB end state,
env assertions, actions, communicated info and NL assertions that the task's `reward_basis` names,
multiplied; 0 for a simulation that does not end with an agent or user stop).

The agent is τ²-bench's `LLMAgent` (its system prompt: instructions + the domain policy, its state and
message handling) whose LLM call goes to the episode's endpoint instead of litellm:
`client.chat.completions.create(model="policy", messages=<τ²-bench's own litellm messages>, tools=<the
domain's tool schemas>, tool_choice="auto", **sampling_args)`, generated and recorded token by token by the
worker; the reply becomes τ²-bench's AssistantMessage (content and tool calls) as its own `generate` makes
it. τ²-bench's code is synchronous: the simulation runs in a thread of its own per episode, and each policy
call is sent back to the episode's event loop (`asyncio.run_coroutine_threadsafe`) on the episode's own
client, so both `rollout.agent.entry_transport` values work (in-process and HTTP).

The user (`user`):
- "llm" (default; τ²-bench's setup): τ²-bench's own `UserSimulator` (its guidelines, the task's scenario,
  the domain's user tools) through litellm: `user_model` at `user_base_url`, an OpenAI-compatible server
  (litellm's `openai/` route; the key read from `user_api_key_file`), or, without a URL, `user_model` as a
  litellm model name with the provider's key from the worker's environment (e.g. gpt-4.1 and
  OPENAI_API_KEY). `user_args` update its litellm arguments (τ²-bench's default: temperature 0).
- "scripted": a user that says its lines in order, whatever the agent says, then "###STOP###": the row's
  `metadata.tau2.user_script` (a list of strings), else one line from the task (its ticket, else the
  scenario's reason for calling / instructions). For smoke tests and tasks one request resolves; it never
  answers a question or uses user tools.
- "solo": τ²-bench's solo mode (no user: `DummyUser`; the agent is τ²-bench's `LLMSoloAgent` with the task's
  ticket in its system prompt, the agent and user tools, the `done` tool to stop). Only tasks with a ticket
  (mock, telecom), as τ²-bench's LLMSoloAgent.check_valid_task says. Its calls send `tool_choice` =
  `solo_tool_choice`: "required" (τ²-bench's; the endpoint enforces it with a grammar, which only the `local`
  engine does: vllm / sglang answer 400) or "auto" (a reply without a tool call then ends the simulation).

Length: `max_steps` (100, the Orchestrator's default; τ²-bench's CLI uses 200) counts every message of the
simulation (agent, user, tool results); a simulation that reaches it ends, and τ²-bench scores it 0. The
policy makes at most about max_steps / 2 + 1 calls: rollout.agent.max_calls must allow them (the call past
max_calls is refused and fails the episode). `max_errors` (10): tool calls that raise, likewise.

The policy's own failures end the simulation as an agent error, which τ²-bench's evaluator scores 0: an
empty reply (τ²-bench itself would raise on it), a prompt grown past the context (the endpoint's
`context_length_exceeded`) and, in solo mode, a reply without a tool call (where LLMSoloAgent raises). A
malformed tool call reaches τ²-bench as text (the endpoint leaves it in the content). Any other error of a
model call (an HTTP error from the endpoint, e.g. the call past rollout.agent.max_calls), of the user
simulator, the judge or the environment fails the episode with its message (Tau2EnvError).

NL assertions (retail's reward, and tasks that name NL_ASSERTION): τ²-bench's judge is
`tau2.config.DEFAULT_LLM_NL_ASSERTIONS` (gpt-4.1 through litellm). `judge_model` (+ `judge_base_url`,
`judge_api_key_file`, as for the user) replaces it, process-wide (the evaluator's module constants are set;
every episode of a worker has the same args). Without one, a task whose reward needs the judge is refused
unless OPENAI_API_KEY is set.

Data: τ²-bench finds its domains' files under its data directory, read when tau2 is first imported:
TAU2_DATA_DIR, else `<source>/data` for an editable install. When TAU2_DATA_DIR is unset and tau2 was
pip-installed from a local clone (its direct_url.json names a directory holding data/tau2/domains), this
module sets TAU2_DATA_DIR to that clone's data/ before importing tau2. It also sets
LITELLM_LOCAL_MODEL_COST_MAP=True when unset, so that litellm (imported by tau2) uses its bundled model cost
map instead of downloading it from GitHub at import (seconds of retries on a worker without network).

Not supported: voice / full-duplex simulations, the banking_knowledge domain (its retrieval configuration is
not passed; refused), τ²-bench's other agents (the agent is always the policy), τ²-bench's gym interface.
Only the reward comes back (not the reward breakdown). Importing tau2 sets process-wide state in litellm
(drop_params, its HTTP client sessions) and loads a .env file if one is found (python-dotenv); its loguru
logs are disabled here (`tau2_logs: true` enables them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import json
import os
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

MODEL = "policy"
USERS = ("llm", "scripted", "solo")
SOLO_TOOL_CHOICES = ("required", "auto")
INSTALL = ("τ²-bench is not on PyPI: git clone https://github.com/sierra-research/tau2-bench and "
           "pip install --ignore-requires-python ./tau2-bench (see docs/environments.md, τ²-bench)")
UNSUPPORTED_DOMAINS = {"banking_knowledge": "its retrieval pipeline configuration is not passed by the adapter"}


def _default_data_dir() -> None:
    """TAU2_DATA_DIR = <clone>/data when tau2 was pip-installed from a local clone and the variable is unset."""
    if os.environ.get("TAU2_DATA_DIR"):
        return
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        info = json.loads(distribution("tau2").read_text("direct_url.json") or "null")
    except (ImportError, PackageNotFoundError, ValueError, OSError):
        return
    url = info.get("url", "") if isinstance(info, dict) else ""
    if url.startswith("file://"):
        data = Path(unquote(urlparse(url).path)) / "data"
        if (data / "tau2" / "domains").is_dir():
            os.environ["TAU2_DATA_DIR"] = str(data)


_default_data_dir()
# litellm (tau2's LLM client) downloads its model cost map from GitHub when imported, retrying for seconds where
# there is no network: its bundled copy instead, unless the worker's environment says otherwise
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
try:
    from loguru import logger as _loguru

    _loguru.disable("tau2")  # before the import: tau2 logs at DEBUG to stderr (every step) by default
    # tau2's import (litellm, its registry) takes seconds: here, when the worker loads the entry, not in an episode
    from tau2.agent.base_agent import AgentError
    from tau2.agent.llm_agent import LLMAgent, LLMSoloAgent
    from tau2.data_model.message import AssistantMessage, MultiToolMessage, ToolCall, UserMessage
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.data_model.tasks import RewardType, Task
    from tau2.orchestrator.orchestrator import Orchestrator, Role
    from tau2.registry import registry
    from tau2.runner.build import build_environment, build_user
    from tau2.runner.simulation import run_simulation
    from tau2.user.user_simulator import DummyUser
    from tau2.user.user_simulator_base import STOP, HalfDuplexUser, UserState
    from tau2.utils.llm_utils import to_litellm_messages
    from tau2.utils.utils import DATA_DIR
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(f"rollout_service.environments.tau2_env needs τ²-bench ({exc}); {INSTALL}. (PyPI's `tau2` "
                      "is an unrelated package: uninstall it first.)") from exc


class Tau2EnvError(RuntimeError):
    """The simulation cannot be set up or run (a bad argument or row, a failed call); says why and what to do."""


class PolicyEnded(AgentError):
    """The policy ended the simulation by its own doing (an empty reply, a prompt past the context)."""


class Cancelled(Exception):
    """The episode was cancelled (rollout.agent.timeout_s): the simulation's thread stops at its next call."""


# --- the policy as τ²-bench's agent ------------------------------------------------------------------------


def assistant_message(reply: Any, seconds: float) -> AssistantMessage:
    """τ²-bench's AssistantMessage for an OpenAI chat completion, as tau2.utils.llm_utils.generate makes it."""
    choice = reply.choices[0]
    msg = choice.message
    calls, extra = [], ""
    for tc in msg.tool_calls or []:
        try:
            arguments = json.loads(tc.function.arguments or "{}")
        except ValueError:
            arguments = None
        if isinstance(arguments, dict):
            calls.append(ToolCall(id=tc.id or "", name=tc.function.name, arguments=arguments))
        else:  # (jetrl's endpoint leaves a malformed call in the content): the call as text
            raw = json.dumps({"name": tc.function.name, "arguments": tc.function.arguments})
            extra += f"<tool_call>{raw}</tool_call>"
    content = (msg.content or "") + extra or None
    usage = getattr(reply, "usage", None)
    if usage is not None:
        usage = {"completion_tokens": usage.completion_tokens, "prompt_tokens": usage.prompt_tokens}
    return AssistantMessage(role="assistant", content=content, tool_calls=calls or None, cost=0.0, usage=usage,
                            raw_data=reply.model_dump(), generation_time_seconds=seconds)


class Policy:
    """The episode's client, called from the simulation's thread: each call runs on the episode's event loop."""

    def __init__(self, client, loop: asyncio.AbstractEventLoop, sampling_args: dict | None = None):
        self.client, self.loop = client, loop
        self.sampling_args = dict(sampling_args or {})
        self.cancelled = threading.Event()
        self._pending: concurrent.futures.Future | None = None

    def __call__(self, messages: list, tools: list, tool_choice: str) -> AssistantMessage:
        if self.cancelled.is_set():
            raise Cancelled()
        request: dict[str, Any] = {"model": MODEL, "messages": to_litellm_messages(messages),
                                   **self.sampling_args}
        if tools:
            request["tools"] = [t.openai_schema for t in tools]
            request["tool_choice"] = tool_choice
        start = time.perf_counter()
        future = asyncio.run_coroutine_threadsafe(self.client.chat.completions.create(**request), self.loop)
        self._pending = future
        try:
            reply = future.result()
        except concurrent.futures.CancelledError:
            raise Cancelled() from None
        except Exception as exc:
            if _context_exceeded(exc):
                raise PolicyEnded(f"the prompt outgrew the policy's context: {exc}") from None
            raise Tau2EnvError(f"the policy's call failed: {type(exc).__name__}: {exc}") from None
        finally:
            self._pending = None
        message = assistant_message(reply, time.perf_counter() - start)
        if not (message.has_content() or message.is_tool_call()):
            raise PolicyEnded("the policy's reply was empty")
        return message

    def cancel(self) -> None:
        self.cancelled.set()
        pending = self._pending
        if pending is not None:
            pending.cancel()


def _context_exceeded(exc: Exception) -> bool:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        body = body.get("error", body)
        return isinstance(body, dict) and body.get("code") == "context_length_exceeded"
    return False


def _add_input(message, state) -> None:
    if isinstance(message, MultiToolMessage):
        state.messages.extend(message.tool_messages)
    elif message is not None:
        state.messages.append(message)


class PolicyAgent(LLMAgent):
    """τ²-bench's LLMAgent (system prompt, state, message handling) whose LLM is the policy behind the endpoint."""

    def __init__(self, tools: list, domain_policy: str, policy: Policy):
        super().__init__(tools=tools, domain_policy=domain_policy, llm=MODEL, llm_args={})
        self.policy = policy

    def _generate_next_message(self, message, state) -> AssistantMessage:  # LLMAgent's, with the policy's call
        if isinstance(message, UserMessage) and message.is_audio:
            raise ValueError("User message cannot be audio.")
        _add_input(message, state)
        return self.policy(state.system_messages + state.messages, self.tools, "auto")

    def set_seed(self, seed: int) -> None:
        """The policy samples as rollout.sampling says (a fixed seed would make a group's episodes alike)."""


class PolicySoloAgent(LLMSoloAgent):
    """τ²-bench's LLMSoloAgent (ticket in the system prompt, the `done` stop tool, tool_choice required unless
    told otherwise) whose LLM is the policy. A reply without a tool call is returned, not raised: the
    orchestrator ends the simulation on the agent's error (reward 0)."""

    def __init__(self, tools: list, domain_policy: str, task: Task, policy: Policy, tool_choice: str = "required"):
        super().__init__(tools=tools, domain_policy=domain_policy, task=task, llm=MODEL, llm_args={})
        self.policy, self.tool_choice = policy, tool_choice

    def generate_next_message(self, message, state):
        if isinstance(message, UserMessage):
            raise ValueError("LLMSoloAgent does not support user messages.")
        _add_input(message, state)
        reply = self.policy(state.system_messages + state.messages, self.tools, self.tool_choice)
        if reply.is_tool_call():
            reply = self._check_if_stop_toolcall(reply)
        state.messages.append(reply)
        return reply, state

    def set_seed(self, seed: int) -> None:
        """See PolicyAgent.set_seed."""


class ScriptedUserState(UserState):
    said: int = 0


class ScriptedUser(HalfDuplexUser):
    """A user that says `lines` in order, whatever the agent says, then τ²-bench's stop signal (###STOP###)."""

    def __init__(self, lines: list[str]):
        super().__init__(instructions=None, tools=None)
        self.lines = list(lines)

    def get_init_state(self, message_history=None) -> ScriptedUserState:
        return ScriptedUserState(system_messages=[], messages=list(message_history or []))

    def generate_next_message(self, message, state: ScriptedUserState):
        _add_input(message, state)
        text = self.lines[state.said] if state.said < len(self.lines) else STOP
        state.said += 1
        reply = UserMessage(role="user", content=text, cost=0.0)
        state.messages.append(reply)
        return reply, state

    def set_seed(self, seed: int) -> None:
        pass


class _Orchestrator(Orchestrator):
    """τ²-bench's half-duplex Orchestrator; a PolicyEnded in the agent's turn ends the simulation as an agent
    error (as the orchestrator ends one on a protocol violation), which the evaluator scores 0."""

    def _policy_ended(self) -> None:
        self.done = True
        self.termination_reason = TerminationReason.AGENT_ERROR

    def initialize(self) -> None:
        try:
            super().initialize()
        except PolicyEnded:  # solo mode: the agent's first call is made here
            self.trajectory, self.message, self.from_role, self.to_role = [], None, Role.AGENT, Role.USER
            self._policy_ended()

    def step(self) -> None:
        try:
            super().step()
        except PolicyEnded:
            self._policy_ended()


# --- the task, the user, the judge ---------------------------------------------------------------------------

_lock = threading.Lock()
_tasks: dict[str, dict[str, Task]] = {}


def check_domain(domain: str) -> None:
    if not isinstance(domain, str) or domain not in registry.get_domains():
        raise Tau2EnvError(f"τ²-bench has no domain {domain!r} (its domains: {', '.join(registry.get_domains())})")
    if domain in UNSUPPORTED_DOMAINS:
        raise Tau2EnvError(f"τ²-bench domain {domain!r} is not supported by the adapter: "
                           f"{UNSUPPORTED_DOMAINS[domain]}")
    if not (Path(DATA_DIR) / "tau2" / "domains").is_dir():
        raise Tau2EnvError(f"τ²-bench's data directory {DATA_DIR} has no tau2/domains: set TAU2_DATA_DIR to the "
                           "clone's data/ directory where the rollout workers start (or pip install -e the clone)")


def load_tasks(task_set: str, split: str | None = None) -> list[Task]:
    """The tasks of a τ²-bench task set (all of them, or one of its splits), with τ²-bench's own loader."""
    if task_set not in registry.get_task_sets():
        raise Tau2EnvError(f"τ²-bench has no task set {task_set!r} "
                           f"(its task sets: {', '.join(registry.get_task_sets())})")
    loader = registry.get_tasks_loader(task_set)
    takes_split = bool(inspect.signature(loader).parameters)
    if split is not None and not takes_split:
        raise Tau2EnvError(f"τ²-bench task set {task_set!r} has no splits")
    try:
        return loader(split) if takes_split else loader()
    except FileNotFoundError as exc:
        raise Tau2EnvError(f"τ²-bench task set {task_set!r}: a data file is missing ({exc}); is TAU2_DATA_DIR the "
                           "clone's data/ directory, with all its files?") from None
    except ValueError as exc:
        raise Tau2EnvError(f"τ²-bench task set {task_set!r}: {exc}") from None


def task_splits(task_set: str) -> dict[str, list[str]]:
    loader = registry.get_task_splits_loader(task_set)
    if loader is None:
        return {}
    try:
        return loader()
    except FileNotFoundError:
        return {}


def find_task(task_set: str, task_id: str) -> Task:
    """A copy of the task `task_id` of `task_set` (the set is loaded once per process)."""
    with _lock:
        by_id = _tasks.get(task_set)
    if by_id is None:
        by_id = {t.id: t for t in load_tasks(task_set)}
        with _lock:
            _tasks.setdefault(task_set, by_id)
    task = by_id.get(task_id)
    if task is None:
        known = sorted(by_id)
        raise Tau2EnvError(f"τ²-bench task set {task_set!r} has no task {task_id!r} ({len(known)} tasks: "
                           f"{', '.join(known[:8])}{', ...' if len(known) > 8 else ''})")
    return task.model_copy(deep=True)


def row_task(task: dict, domain: str) -> tuple[str, str, list[str] | None]:
    """(task_set, task_id, user_script) of a jetrl task's `metadata.tau2`."""
    where = f"task {task.get('prompt_id', '?')}"
    meta = (task.get("metadata") or {}).get("tau2")
    if not isinstance(meta, dict) or not isinstance(meta.get("task_id"), str):
        raise Tau2EnvError(f"{where} has no metadata.tau2.task_id (the τ²-bench task to play); write the rows "
                           f"with `python -m rollout_service.environments.tau2_data --domain {domain} --out DIR`")
    if meta.get("domain", domain) != domain:
        raise Tau2EnvError(f"{where} is a task of τ²-bench domain {meta['domain']!r}, but the adapter's domain "
                           f"is {domain!r} (rollout.workflow_args.args.domain)")
    script = meta.get("user_script")
    if script is not None and not (isinstance(script, list) and all(isinstance(s, str) for s in script)):
        raise Tau2EnvError(f"{where}: metadata.tau2.user_script must be a list of strings")
    return str(meta.get("task_set") or domain), meta["task_id"], script


def opening_line(task: Task) -> str:
    """What a scripted user says first when the row gives no script: the ticket, else the reason for calling."""
    if task.ticket:
        return task.ticket
    instructions = task.user_scenario.instructions
    if isinstance(instructions, str):
        return instructions
    return "\n".join(x for x in (instructions.reason_for_call, instructions.known_info) if x)


def _key_from(path: str, what: str) -> str:
    if not path:
        return "EMPTY"
    try:
        key = Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise Tau2EnvError(f"{what}: cannot read {path}: {exc}") from None
    if not key:
        raise Tau2EnvError(f"{what}: {path} is empty")
    return key


def litellm_target(model: str, base_url: str, key_file: str, what: str) -> tuple[str, dict]:
    """(litellm model name, litellm args) for `model`, at an OpenAI-compatible `base_url` when one is given."""
    if not base_url:
        return model, {}
    name = model if model.startswith("openai/") else f"openai/{model}"
    return name, {"api_base": base_url.rstrip("/"), "api_key": _key_from(key_file, f"{what}_api_key_file")}


def configure_judge(model: str, base_url: str, key_file: str) -> None:
    """τ²-bench's NL-assertion judge (its evaluator's module constants): process-wide."""
    from tau2.evaluator import evaluator_nl_assertions as nl

    name, args = litellm_target(model, base_url, key_file, "judge")
    with _lock:
        nl.DEFAULT_LLM_NL_ASSERTIONS = name
        nl.DEFAULT_LLM_NL_ASSERTIONS_ARGS = {"temperature": 0.0, **args}


def needs_judge(task: Task) -> bool:
    crit = task.evaluation_criteria
    return bool(crit and RewardType.NL_ASSERTION in crit.reward_basis and crit.nl_assertions)


# --- the episode ---------------------------------------------------------------------------------------------


def _simulate(policy: Policy, task_json: dict, domain: str, user: str, user_model: str, user_base_url: str,
              user_api_key_file: str, user_args: dict | None, max_steps: int, max_errors: int, seed: int | None,
              judge_model: str, judge_base_url: str, judge_api_key_file: str,
              enforce_communication_protocol: bool, solo_tool_choice: str) -> SimulationRun:
    """One simulation, in the simulation's thread."""
    task_set, task_id, script = row_task(task_json, domain)
    task = find_task(task_set, task_id)
    if judge_model:
        configure_judge(judge_model, judge_base_url, judge_api_key_file)
    elif needs_judge(task) and not os.environ.get("OPENAI_API_KEY"):
        raise Tau2EnvError(f"τ²-bench task {task_id!r}: its reward includes NL assertions, judged by an LLM "
                           "(τ²-bench's default gpt-4.1 through litellm): set judge_model (and judge_base_url) "
                           "or OPENAI_API_KEY where the rollout workers run")
    solo = user == "solo"
    if solo and not LLMSoloAgent.check_valid_task(task):
        raise Tau2EnvError(f"τ²-bench task {task_id!r} cannot be played solo (τ²-bench's LLMSoloAgent needs a "
                           "ticket and expected actions, or a history of tool calls only): use user llm or "
                           "scripted")
    try:
        environment = build_environment(domain, solo_mode=solo)
    except FileNotFoundError as exc:
        raise Tau2EnvError(f"τ²-bench domain {domain!r}: a data file is missing ({exc})") from None
    if solo:
        tools = environment.get_tools() + (environment.get_user_tools() or [])
        agent = PolicySoloAgent(tools, environment.get_policy(), task, policy, solo_tool_choice)
        participant = DummyUser()
    else:
        agent = PolicyAgent(environment.get_tools(), environment.get_policy(), policy)
        if user == "scripted":
            participant = ScriptedUser(script if script is not None else [opening_line(task)])
        else:
            name, args = litellm_target(user_model, user_base_url, user_api_key_file, "user")
            participant = build_user("user_simulator", environment, task, llm=name,
                                     llm_args={"temperature": 0.0, **args, **(user_args or {})})
    orchestrator = _Orchestrator(domain=domain, agent=agent, user=participant, environment=environment, task=task,
                                 max_steps=max_steps, max_errors=max_errors, seed=seed, solo_mode=solo,
                                 validate_communication=enforce_communication_protocol)
    return run_simulation(orchestrator)


async def _in_thread(fn, on_cancel):
    """fn() in a thread of its own (not the loop's default executor: a simulation holds its thread for the whole
    episode, waiting on calls this loop serves); on cancellation `on_cancel()` and the thread is left to stop."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def settle(result, error):
        if not done.done():
            done.set_exception(error) if error is not None else done.set_result(result)

    def target():
        try:
            result, error = fn(), None
        except BaseException as exc:  # noqa: BLE001 - handed to the episode
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is gone
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name="tau2-simulation", daemon=True).start()
    try:
        return await done
    except asyncio.CancelledError:
        on_cancel()
        raise


def _check_args(domain: str, user: str, user_model: str, max_steps: int, max_errors: int,
                sampling_args: dict | None, user_args: dict | None, solo_tool_choice: str) -> None:
    check_domain(domain)
    if user not in USERS:
        raise Tau2EnvError(f"rollout.workflow_args.args.user={user!r}: one of {', '.join(USERS)}")
    if solo_tool_choice not in SOLO_TOOL_CHOICES:
        raise Tau2EnvError(f"rollout.workflow_args.args.solo_tool_choice={solo_tool_choice!r}: one of "
                           f"{', '.join(SOLO_TOOL_CHOICES)}")
    if user == "llm" and not user_model:
        raise Tau2EnvError("user: llm needs user_model (a model at user_base_url, an OpenAI-compatible server, "
                           "or a litellm model name); or use user: scripted / solo")
    if max_steps < 1 or max_errors < 1:
        raise Tau2EnvError("rollout.workflow_args.args.max_steps and max_errors must be at least 1")
    for name, value in (("sampling_args", sampling_args), ("user_args", user_args)):
        if value is not None and not isinstance(value, dict):
            raise Tau2EnvError(f"rollout.workflow_args.args.{name} must be an object")


async def simulate(client, task: dict, domain: str, user: str = "llm", user_model: str = "",
                   user_base_url: str = "", user_api_key_file: str = "", user_args: dict | None = None,
                   max_steps: int = 100, max_errors: int = 10, sampling_args: dict | None = None,
                   seed: int | None = None, judge_model: str = "", judge_base_url: str = "",
                   judge_api_key_file: str = "", enforce_communication_protocol: bool = False,
                   solo_tool_choice: str = "required", tau2_logs: bool = False) -> SimulationRun:
    """One τ²-bench simulation of the row's task with the policy as the agent: τ²-bench's SimulationRun, its
    `reward_info` set by τ²-bench's evaluator (module docstring)."""
    _check_args(domain, user, user_model, max_steps, max_errors, sampling_args, user_args, solo_tool_choice)
    (_loguru.enable if tau2_logs else _loguru.disable)("tau2")
    policy = Policy(client, asyncio.get_running_loop(), sampling_args)

    def play() -> SimulationRun:
        return _simulate(policy, task, domain, user, user_model, user_base_url, user_api_key_file, user_args,
                         max_steps, max_errors, seed, judge_model, judge_base_url, judge_api_key_file,
                         enforce_communication_protocol, solo_tool_choice)

    try:
        return await _in_thread(play, policy.cancel)
    except (Tau2EnvError, Cancelled):
        raise
    except Exception as exc:
        raise Tau2EnvError(f"τ²-bench simulation failed: {type(exc).__name__}: {exc}") from exc


async def run(client, task: dict, domain: str, user: str = "llm", user_model: str = "", user_base_url: str = "",
              user_api_key_file: str = "", user_args: dict | None = None, max_steps: int = 100,
              max_errors: int = 10, sampling_args: dict | None = None, seed: int | None = None,
              judge_model: str = "", judge_base_url: str = "", judge_api_key_file: str = "",
              enforce_communication_protocol: bool = False, solo_tool_choice: str = "required",
              tau2_logs: bool = False) -> float:
    """One episode: a τ²-bench simulation of the row's task; returns τ²-bench's reward for it."""
    simulation = await simulate(
        client, task, domain, user=user, user_model=user_model, user_base_url=user_base_url,
        user_api_key_file=user_api_key_file, user_args=user_args, max_steps=max_steps, max_errors=max_errors,
        sampling_args=sampling_args, seed=seed, judge_model=judge_model, judge_base_url=judge_base_url,
        judge_api_key_file=judge_api_key_file, enforce_communication_protocol=enforce_communication_protocol,
        solo_tool_choice=solo_tool_choice, tau2_logs=tau2_logs)
    return float(simulation.reward_info.reward)
