"""Per-service NATS users: who may publish and subscribe to what. The one table of it (docs/protocol.md,
"Permissions"), built from shared/contract/subjects.py.

Each service connects as its own user (`jetrl-<role>`) whose allow-lists name only the subjects its code
uses; everything else is denied by the server. JetStream's API is subjects too, so the lists also say which
streams a role may look up (`$JS.API.STREAM.INFO.<stream>`), which durable consumers it may create, read
and acknowledge (`$JS.API.CONSUMER.*.<stream>.<consumer>`, `$JS.ACK.<stream>.<consumer>.>`), and who may
write the weights KV bucket (`$KV.jetrl_weights.<run>`: the trainer only). Stream create/update belongs to
the controller (it runs `ensure_streams`; every other service only binds to existing streams), and only
the `admin` user (operators' tools) may delete streams or consumers of other services.

`run` scopes a role to one run (`jetrl.<run>.…`, the consumers and KV key of that run): `jetrl up` knows the
run and scopes every service but the controller (which serves every run it is asked to create). `"*"`
(compose, Helm: the run is chosen at start) allows every run: a worker can then publish the trajectories
of any run of the same NATS account, but still cannot touch the streams, the weights or the prompts.

`server_authorization(users, run)` renders the `authorization { users = [...] }` block of a nats-server
config; the embedded server (shared/runtime/natsd.py), `jetrl nats-config` and compose/nats.conf use it.
"""

from __future__ import annotations

import json

from shared.contract import subjects

ROLES = ("admin", "controller", "rollout", "reward", "trainer", "tracker", "eval", "agent")
USER_PREFIX = "jetrl-"

_S = subjects
KV_STREAM = f"KV_{_S.WEIGHTS_KV_BUCKET}"  # the stream behind the weights KV bucket
SESSIONS_STREAM = f"KV_{_S.SESSIONS_KV_BUCKET}"  # the stream behind the online sessions' bucket
_API = "$JS.API"


def user_name(role: str) -> str:
    """The NATS user of a role: `jetrl-rollout`, ..."""
    check_role(role)
    return USER_PREFIX + role


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"NATS role {role!r} is unknown: use one of {', '.join(ROLES)}")
    return role


def _run(run: str) -> str:
    return run if run == "*" else _S.check_run_id(run)


def _bind_streams() -> list[str]:
    """Look up the streams and the KV bucket (what `ensure_streams` with streams.manage false and
    nats-py's `js.key_value()` do)."""
    return [f"{_API}.STREAM.INFO.{s}" for s in (*_S.ALL_STREAMS, KV_STREAM, SESSIONS_STREAM)]


def _durable(stream: str, consumer: str) -> list[str]:
    """Create (any nats-py / server form), look up, fetch from and acknowledge one durable pull consumer."""
    return [f"{_API}.CONSUMER.CREATE.{stream}.{consumer}", f"{_API}.CONSUMER.CREATE.{stream}.{consumer}.>",
            f"{_API}.CONSUMER.DURABLE.CREATE.{stream}.{consumer}", f"{_API}.CONSUMER.INFO.{stream}.{consumer}",
            f"{_API}.CONSUMER.MSG.NEXT.{stream}.{consumer}", f"$JS.ACK.{stream}.{consumer}.>"]


def _ordered(stream: str) -> list[str]:
    """An ephemeral ordered push consumer (nats-py's `js.subscribe(ordered_consumer=True)`, KV watch and
    history): create it, read its info (kv.watch does), answer its flow control."""
    return [f"{_API}.CONSUMER.CREATE.{stream}", f"{_API}.CONSUMER.INFO.{stream}.*", f"$JS.FC.{stream}.>"]


def _kv_read(run: str) -> list[str]:
    """Read and watch the weights KV key of `run` (weight_store/announce.py: get, watch, history)."""
    bucket = _S.WEIGHTS_KV_BUCKET
    return [*_ordered(KV_STREAM), f"{_API}.DIRECT.GET.{KV_STREAM}.$KV.{bucket}.{run}",
            f"{_API}.STREAM.MSG.GET.{KV_STREAM}"]


def _sessions(run: str) -> list[str]:
    """Write, delete, read and list the online session records of `run` (rollout_service/online/records.py).
    Writes and gets are scoped to the run's keys; listing is an ordered consumer on the bucket's stream, as
    the weights bucket's watch is (docs/environments.md says what that means for runs sharing an account)."""
    bucket = _S.SESSIONS_KV_BUCKET
    return [f"$KV.{bucket}.{run}.*", *_ordered(SESSIONS_STREAM), f"{_API}.DIRECT.GET.{SESSIONS_STREAM}.$KV.{bucket}.{run}.*"]


def _consumer(name: str, run: str) -> str:
    """A durable's name token: `rollout-<run>`, or `*` for every run (a wildcard is a whole token)."""
    return "*" if run == "*" else f"{name}-{run}"


def _events(run: str, service: str) -> str:
    return f"jetrl.{run}.events.{service}"


def permissions(role: str, run: str = "*") -> dict:
    """The nats-server `permissions` of `role` scoped to `run` ("*" = every run)."""
    check_role(role)
    r = _run(run)
    inbox = ["_INBOX.>"]  # replies of requests and JetStream API calls, push deliveries
    if role == "admin":
        return {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
    if role == "controller":
        # Serves every run it is asked to create: not scoped to one run.
        streams = [f"{_API}.STREAM.{op}.{s}" for op in ("CREATE", "UPDATE", "INFO")
                   for s in (*_S.ALL_STREAMS, KV_STREAM, SESSIONS_STREAM)]
        pub = [*streams, "jetrl.*.prompts", "jetrl.*.events.controller", "jetrl.*.dlq.>",
               *_durable(_S.EVENTS_STREAM, "*"), *_durable(_S.DLQ_STREAM, "*"),
               f"{_API}.CONSUMER.INFO.{_S.PROMPTS_STREAM}.*", f"{_API}.CONSUMER.INFO.{_S.TRAJECTORIES_STREAM}.*",
               f"{_API}.STREAM.MSG.GET.{_S.TRAJECTORIES_STREAM}", f"{_API}.DIRECT.GET.{_S.TRAJECTORIES_STREAM}.>",
               f"{_API}.INFO", *_kv_read("*")]
        return {"publish": {"allow": pub}, "subscribe": {"allow": inbox}}
    if role == "rollout":
        pub = [*_bind_streams(), f"jetrl.{r}.trajectories", _events(r, "rollout"), f"jetrl.{r}.dlq.>",
               *_durable(_S.PROMPTS_STREAM, _consumer("rollout", r)), f"jetrl.{r}.agents.*", "jetrl.reward.*",
               *_kv_read(r), *_sessions(r)]
        return {"publish": {"allow": pub}, "subscribe": {"allow": inbox}}
    if role == "trainer":
        pub = [*_bind_streams(), _events(r, "trainer"), f"jetrl.{r}.dlq.>",
               *_durable(_S.TRAJECTORIES_STREAM, _consumer("trainer", r)),
               f"{_API}.CONSUMER.DELETE.{_S.TRAJECTORIES_STREAM}.{_consumer('trainer', r)}",
               f"$KV.{_S.WEIGHTS_KV_BUCKET}.{r}", *_kv_read(r), *_ordered(_S.EVENTS_STREAM)]
        return {"publish": {"allow": pub}, "subscribe": {"allow": inbox}}
    if role == "reward":
        # A NATS micro service: answers requests (allow_responses) on jetrl.reward.<task> and $SRV.*; reads
        # the weights KV for reward.judge.follow_policy (reward_service/judge/follow.py).
        pub = [*_bind_streams(), "jetrl.*.events.reward" if r == "*" else _events(r, "reward"), *_kv_read(r)]
        return {"publish": {"allow": pub}, "subscribe": {"allow": [*inbox, "jetrl.reward.*", "$SRV.>"]},
                "allow_responses": True}
    if role == "tracker":
        pub = [*_bind_streams(), f"{_API}.STREAM.NAMES", *_ordered(_S.EVENTS_STREAM),
               *_ordered(_S.TRAJECTORIES_STREAM)]
        return {"publish": {"allow": pub}, "subscribe": {"allow": inbox}}
    if role == "eval":
        pub = [*_bind_streams(), _events(r, "eval"), f"jetrl.{r}.agents.*", "jetrl.reward.*", *_kv_read(r)]
        return {"publish": {"allow": pub}, "subscribe": {"allow": inbox}}
    # agent: a long-running agent service (docs/agents.md) takes episodes of its run and answers them.
    return {"publish": {"allow": [f"{_API}.STREAM.INFO.{_S.EVENTS_STREAM}"]},
            "subscribe": {"allow": [*inbox, f"jetrl.{r}.agents.*"]}, "allow_responses": True}


def _value(v) -> str:
    """A nats-server config value: JSON strings and lists (the config format accepts JSON), `$VAR`
    references left bare so the server substitutes them from its environment."""
    if isinstance(v, str) and v.startswith("$") and v[1:].replace("_", "").isalnum():
        return v
    return json.dumps(v)


def server_authorization(passwords: dict[str, str], run: str = "*", indent: str = "") -> str:
    """The `authorization { users = [...] }` block: one user per role in `passwords` ({role: password,
    or `$ENV_VAR` for the server to read from its environment}), each with `permissions(role, run)`."""
    lines = [f"{indent}authorization {{", f"{indent}  users = ["]
    for role, password in passwords.items():
        perms = permissions(role, run)
        lines.append(f"{indent}    {{user: {_value(user_name(role))}, password: {_value(password)}, permissions: {{")
        for key in ("publish", "subscribe"):
            lines.append(f"{indent}      {key}: {{allow: {_value(perms[key]['allow'])}}}")
        if perms.get("allow_responses"):
            lines.append(f"{indent}      allow_responses: true")
        lines.append(f"{indent}    }}}}")
    lines += [f"{indent}  ]", f"{indent}}}"]
    return "\n".join(lines) + "\n"


def env_var(role: str) -> str:
    """The environment variable holding a role's password in compose (.env) and nats.conf."""
    return f"JETRL_NATS_PASSWORD_{check_role(role).upper()}"


HELM_VALUES_KEY = "jetrlPermissions"


def helm_values(run: str = "*") -> str:
    """`nats.jetrlPermissions` of the Helm chart (deploy/helm/jetrl/values.yaml): every role's
    `permissions(role, run)`, one JSON (= YAML flow) line per role, indented to sit under `nats:`. The chart
    renders its NATS server's users from it; `jetrl nats-config --helm [--run RUN]` prints it."""
    lines = [f"  {HELM_VALUES_KEY}:"]
    lines += [f"    {role}: {json.dumps(permissions(role, run))}" for role in ROLES]
    return "\n".join(lines) + "\n"
