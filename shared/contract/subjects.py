"""Every stream, subject, KV bucket and consumer name in jetrl, built from the run id.

One place, so a reader can find where any message travels. docs/protocol.md mirrors this file.
Run ids are restricted to [A-Za-z0-9_-] so they are safe as NATS subject tokens.
"""

from __future__ import annotations

import re

# Streams hold the subjects of every run: `jetrl.*.<kind>` (and deeper for events/dlq).
PROMPTS_STREAM = "PROMPTS"
TRAJECTORIES_STREAM = "TRAJECTORIES"
EVENTS_STREAM = "EVENTS"
DLQ_STREAM = "DLQ"
ALL_STREAMS = (PROMPTS_STREAM, TRAJECTORIES_STREAM, EVENTS_STREAM, DLQ_STREAM)

# Latest committed weight version per run: key = run id, value = WeightVersion (msgpack).
WEIGHTS_KV_BUCKET = "jetrl_weights"

# Online sessions (`jetrl serve-policy`, rollout_service/online/): key = `<run>.<session id>`, value = the
# session's record (msgpack: its recorded calls, group key, reward), deleted once published or expired.
SESSIONS_KV_BUCKET = "jetrl_sessions"

# Header carrying the idempotency key of a JetStream publish.
MSG_ID_HEADER = "Nats-Msg-Id"

# Always fullmatch: with re.match, `$` also matches before a trailing newline ("evil\n" would pass).
_RUN_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_run_id(run: str) -> str:
    """Return `run` if it is a valid run id, else raise ValueError saying what is allowed."""
    if not isinstance(run, str) or not _RUN_RE.fullmatch(run):
        raise ValueError(f"run id {run!r} is invalid: use 1-64 characters of A-Z a-z 0-9 _ -")
    return run


def check_token(name: str, what: str) -> str:
    if not isinstance(name, str) or not _TOKEN_RE.fullmatch(name):
        raise ValueError(f"{what} {name!r} is invalid: use 1-64 characters of A-Z a-z 0-9 _ -")
    return name


# --- subjects -------------------------------------------------------------------------------------


def prompts(run: str) -> str:
    return f"jetrl.{check_run_id(run)}.prompts"


def trajectories(run: str) -> str:
    return f"jetrl.{check_run_id(run)}.trajectories"


def events(run: str, service: str) -> str:
    return f"jetrl.{check_run_id(run)}.events.{check_token(service, 'service name')}"


def events_all(run: str) -> str:
    """Wildcard over every service's events of one run."""
    return f"jetrl.{check_run_id(run)}.events.>"


def dlq(run: str, source: str) -> str:
    return f"jetrl.{check_run_id(run)}.dlq.{check_token(source, 'dead-letter source')}"


def dlq_all(run: str) -> str:
    return f"jetrl.{check_run_id(run)}.dlq.>"


def reward(task: str) -> str:
    """Request/reply subject of the reward service for one task (queue group `reward_queue`)."""
    return f"jetrl.reward.{check_token(task, 'reward task')}"


REWARD_QUEUE_GROUP = "jetrl-reward"


def agent_episodes(run: str, agent: str) -> str:
    """Request/reply subject on which a long-running agent service takes episodes (docs/agents.md)."""
    return f"jetrl.{check_run_id(run)}.agents.{check_token(agent, 'agent service name')}"


AGENT_QUEUE_GROUP = "jetrl-agents"

# Stream subject filters (cover every run).
STREAM_SUBJECTS = {
    PROMPTS_STREAM: ["jetrl.*.prompts"],
    TRAJECTORIES_STREAM: ["jetrl.*.trajectories"],
    EVENTS_STREAM: ["jetrl.*.events.>"],
    DLQ_STREAM: ["jetrl.*.dlq.>"],
}

# --- durable consumers ----------------------------------------------------------------------------


def rollout_consumer(run: str) -> str:
    """All rollout workers of a run share one durable pull consumer: JetStream spreads the work."""
    return f"rollout-{check_run_id(run)}"


def trainer_consumer(run: str) -> str:
    return f"trainer-{check_run_id(run)}"


def controller_events_consumer(run: str) -> str:
    return f"controller-events-{check_run_id(run)}"


def controller_dlq_consumer(run: str) -> str:
    return f"controller-dlq-{check_run_id(run)}"


def group_id(run: str, epoch: int, prompt_id: str) -> str:
    """Idempotency key of a prompt task and of its trajectory group: `<run>:<epoch>:<prompt_id>`."""
    return f"{run}:{epoch}:{prompt_id}"


def session_key(run: str, session_id: str) -> str:
    """The key of an online session's record in SESSIONS_KV_BUCKET."""
    return f"{check_run_id(run)}.{check_token(session_id, 'session id')}"
