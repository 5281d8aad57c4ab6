"""Rollout workflows and their tools: multi-turn feedback, tool calling, the rollout service's consumer."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from shared.config.base import Section


class MultiTurnConfig(Section):
    max_turns: int = Field(3, ge=1, description="Most answers the agent may give (K).")
    turn_discount: float = Field(
        0.9, ge=0, le=1, description="Reward of an answer given at turn t (0-based) is multiplied by this ** t."
    )
    feedback: str = Field("\nwrong, try again\n", description="Environment message after an answer that failed.")
    success_reward: float = Field(1.0, description="An answer scoring at least this ends the episode.")


class McpServerConfig(Section):
    """One MCP server whose tools the tool-calling workflow offers (rollout_service/tools/mcp_tools.py)."""

    SECTION = "rollout.tools.mcp"
    name: str = Field(
        ..., min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
        description="Name of the server: in logs, errors and (by default) the prefix of its tools' names.",
    )
    transport: Literal["stdio", "http"] = Field(
        "stdio", description="stdio: start `command` as a subprocess and talk over its stdin/stdout; http: "
        "connect to a streamable HTTP endpoint at `url`.",
    )
    command: list[str] = Field(
        default_factory=list, description="stdio: the server's argv (program, then arguments). The subprocess gets "
        "only HOME, LOGNAME, PATH, SHELL, TERM, USER of the worker's environment, plus `env`.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="stdio: extra environment variables of the server.")
    cwd: str = Field(
        "", description="stdio: working directory of the server ('' = the worker's). With `sandbox`, this directory "
        "is also shown read-only inside the sandbox.",
    )
    sandbox: bool = Field(
        False, description="stdio: run the server inside bubblewrap (shared/runtime/sandbox.py): no network, its own "
        "pid namespace (dies with the worker), uid 65534, only /usr, /lib*, /bin, the Python interpreter's prefix "
        "and `cwd` visible (read-only), a private tmpfs work dir. No rlimits or cgroup (unlike the python tool). "
        "Start-up fails with an error when bwrap is not installed.",
    )
    url: str = Field("", description="http: the server's streamable HTTP endpoint, e.g. http://127.0.0.1:8000/mcp.")
    token_file: str = Field(
        "", description="http: a file (mode 0600 or stricter) holding a bearer token sent as `Authorization: Bearer "
        "<token>` ('' = none). There is no inline token field: a config never holds the secret.",
    )
    tool_prefix: str | None = Field(
        None, max_length=64, pattern=r"^[A-Za-z0-9_.-]*$", description="Prefix of the server's tool names as the "
        "model sees them (None = '<name>.'; '' = none). A clash with another tool's name is a start-up error.",
    )
    connect_timeout_s: float = Field(
        20.0, gt=0, description="Start the server (or connect to it), initialize the session and list its tools "
        "within this long, or the worker fails to start.",
    )
    max_tools: int = Field(
        32, ge=1, le=1024, description="Most tools taken from the server; past it the rest are dropped (a warning "
        "names how many), so a hostile server cannot flood the prompt.",
    )
    max_schema_chars: int = Field(
        4000, ge=64, description="Longest tool accepted from the server: its name, description and JSON input schema "
        "together, in characters; a longer tool is dropped with a warning.",
    )
    scope: Literal["worker", "episode"] = Field(
        "worker", description="worker: one connection (one server process, for stdio) shared by all episodes of a "
        "rollout worker, started with the worker and closed with it. episode: a fresh connection (a fresh server "
        "process, for stdio; a fresh MCP session, for http) for each episode, closed when it ends, so no "
        "episode sees another's state (a server is also started once at worker start, to check it and list its "
        "tools).",
    )
    tools: list[str] = Field(
        default_factory=list, description="Only these of the server's tools (their names on the server) are "
        "offered ([] = all it lists); a name the server does not list stops the worker at start.",
    )

    @model_validator(mode="after")
    def _transport_needs(self):
        if self.transport == "stdio":
            if not self.command:
                raise ValueError(f"{self.SECTION} {self.name!r}: transport stdio needs a command")
            if self.url or self.token_file:
                raise ValueError(f"{self.SECTION} {self.name!r}: url and token_file are for transport http")
        else:
            if not self.url.startswith(("http://", "https://")):
                raise ValueError(f"{self.SECTION} {self.name!r}: transport http needs an http(s):// url")
            if self.command or self.env or self.cwd or self.sandbox:
                raise ValueError(f"{self.SECTION} {self.name!r}: command, env, cwd and sandbox are for transport stdio")
        return self


class ToolsConfig(Section):
    enabled: list[str] = Field(
        default_factory=lambda: ["calculator", "python", "search"],
        description="Built-in tools offered to the model: calculator | python | search.",
    )
    timeout_s: float = Field(5.0, gt=0, description="Wall-clock limit of one tool call; a call past it is cut off.")
    max_output_chars: int = Field(2000, ge=16, description="Tool output longer than this is truncated.")
    python_memory_mb: int = Field(256, ge=16, description="Address-space limit of the sandboxed Python process.")
    python_cpu_s: int = Field(5, ge=1, description="CPU-seconds limit of the sandboxed Python process.")
    python_output_bytes: int = Field(
        64 * 1024, ge=1024, description="The python tool reads at most this much stdout (and stderr); past it the "
        "sandbox is killed.",
    )
    corpus: str = Field(
        "", description="Search tool: a directory of .txt/.md files or a .jsonl file with a 'text' field ('' = off)."
    )
    search_top_k: int = Field(3, ge=1, description="Search tool: passages returned per query.")
    mcp: list[McpServerConfig] = Field(
        default_factory=list, description="MCP servers whose tools are offered next to the built-in ones "
        "(tool_agent workflow); each tool is named '<prefix><its name>'.",
    )

    @model_validator(mode="after")
    def _mcp_names_unique(self):
        names = [s.name for s in self.mcp]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"rollout.tools.mcp: server name(s) {', '.join(dup)} used twice")
        return self


class ToolAgentConfig(Section):
    max_turns: int = Field(4, ge=1, description="Most model turns per sample (tool calls + final answer).")
    tool_choice: Literal["auto", "required"] = Field(
        "auto", description="required: the first turn must call one of the offered tools, with arguments that "
        "match its schema (constrained decoding, as the endpoint's tool_choice 'required'; engine local); later "
        "turns are free. For a policy that has yet to learn the call format.",
    )
    system_prompt: str = Field(
        "", description="System message for chat-template tokenizers ('' = a short default naming the tools)."
    )


class ServiceConfig(Section):
    """The rollout worker's prompt consumer."""

    ack_wait_s: float = Field(30.0, gt=0, description="Redeliver a prompt whose worker sent no ack or heartbeat for this long.")
    max_deliver: int = Field(5, ge=1, description="Deliveries of one prompt before it goes to the dead-letter queue.")
    fetch_batch: int = Field(8, ge=1, description="Prompts fetched per pull request.")
    follow_weights: bool = Field(True, description="Watch weight announcements and swap new versions into the engine.")
    publish_timeout_s: float = Field(10.0, gt=0, description="Wait this long for JetStream to ack a trajectory group.")
    events_batch: int = Field(64, ge=1, description="Group ids per 'published' event (flushed at least every second).")
    max_group_size: int = Field(
        256, ge=1, description="A prompt task asking for more samples than this is dead-lettered unread (a task's "
        "group_size is the sender's to choose: one huge group would exhaust the worker).",
    )
    max_new_tokens: int = Field(
        32768, ge=1, description="A prompt task whose sampling.max_new_tokens exceeds this is dead-lettered.",
    )
    max_prompt_chars: int = Field(
        1_000_000, ge=1, description="A prompt task whose prompt text (or all its messages together) is longer "
        "than this many characters is dead-lettered.",
    )
    max_prompt_tokens: int = Field(
        0, ge=0, description="Longest prompt, in tokens, any engine accepts (0 = the model's context less one "
        "token). A longer prompt is refused before it is tokenized whole (text over this many tokens' worth of "
        "the tokenizer's longest token is refused unread): on the agent endpoint with HTTP 400 "
        "(code context_length_exceeded), on the prompt stream by dead-lettering its group with the reason.",
    )
    max_sample_tokens: int = Field(
        0, ge=0, description="Longest sample, in tokens (prompt and completion, all turns of an agent's episode "
        "merged), a group may carry to the trainer: a group with a longer one is dead-lettered with the reason "
        "instead of published. 0 = the model's context where the engine knows it, else no bound. The trainer's "
        "memory for long samples is bounded by trainer.activation_checkpointing auto (docs/trainer.md, Memory).",
    )
    stop_timeout_s: float = Field(
        60.0, gt=0, description="After SIGTERM, tasks in flight get this long to finish; then they are cancelled "
        "(not acked: JetStream redelivers them) and the worker exits.",
    )
    workers_per_process: int = Field(
        1, ge=1, le=1024, description="Rollout workers one `jetrl rollout` process runs (rollout_service/pool.py): "
        "each has its own engine, prompt consumer, staleness gate and worker id (`<id>-<i>`); they share one NATS "
        "connection, one watch of the weight announcements, one weight download per version and one /metrics "
        "(series labelled `worker`). For many light workers (engine sim, or engines served elsewhere); "
        "`jetrl up --workers N` starts ceil(N / this) processes.",
    )


class AgentConfig(Section):
    """The rollout worker's OpenAI-compatible endpoint (served when rollout.workflow is `agent`) and the
    agents that talk to it (docs/agents.md)."""

    host: str = Field("127.0.0.1", description="Bind address of the worker's OpenAI-compatible endpoint.")
    port: int = Field(0, ge=0, le=65535, description="Its port (0 = a free port, chosen at start-up).")
    public_url: str = Field(
        "", description="Base URL agents are given ('' = http://<host>:<port>); set it when agents reach the "
        "worker through another address (a container, a service name).",
    )
    entry_transport: Literal["in_process", "http"] = Field(
        "in_process", description="How an entry agent's openai client (workflow_args.entry) reaches the endpoint: "
        "in_process calls the endpoint's app directly (httpx.ASGITransport: the same routes, checks and recording, "
        "no socket, no HTTP parsing); http goes over TCP to host:port, as command and service agents do.",
    )
    timeout_s: float = Field(
        300.0, gt=0, description="Wall-clock limit of one episode; an agent still running past it is stopped "
        "and its group dead-lettered (or retried, see retry_failed).",
    )
    max_calls: int = Field(
        64, ge=1, description="Model calls one episode may make; the call past it is refused (HTTP 429) and the "
        "episode fails as never-ending.",
    )
    max_tokens: int = Field(
        0, ge=0, description="Default max_tokens of a call that sets none (0 = rollout.sampling.max_new_tokens).",
    )
    retry_failed: bool = Field(
        False, description="A failed episode (crash, time-out, never-ending) naks its prompt so it is retried "
        "up to rollout.service.max_deliver times, instead of dead-lettering the group at once.",
    )
    model_name: str = Field("", description="Model id the endpoint reports in /v1/models ('' = the run id).")
    max_request_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Largest request body the endpoint reads (HTTP 413 past it), "
        "counted while it is read (chunked bodies without Content-Length too).",
    )
    max_request_tokens: int = Field(
        32768, ge=1, description="Most tokens one request may ask for: n x max_tokens over it is refused (HTTP 400).",
    )
    max_session_sequences: int = Field(
        8, ge=1, description="Most sequences one session (episode) has in the engine at once, over all its "
        "requests; the rest wait their turn, so one agent cannot take the whole batch.",
    )


class OnlineConfig(Section):
    """Online training (`jetrl serve-policy`, rollout_service/online/): outside traffic calls the policy
    through sessions whose rewards arrive later (docs/environments.md, "Online training"). The endpoint is
    rollout.agent's (host, port, public_url and its request bounds)."""

    keys_dir: str = Field(
        "", description="Directory of client application keys: `<app>.key` files (mode 0600, refused otherwise), "
        "one key per line (two lines while rotating); re-read when they change, so a key is added, rotated or "
        "revoked without a restart. Required by `jetrl serve-policy`.",
    )
    session_ttl_s: float = Field(
        24 * 3600.0, gt=0, description="A session with no call and no reward for this long is dropped and counted "
        "(`expired`); its record is deleted.",
    )
    sweep_interval_s: float = Field(10.0, gt=0, description="How often expired sessions are looked for.")
    group_size: int = Field(
        4, ge=2, description="Sessions created with the same `group` key (per application) form one trajectory "
        "group; it is published when this many of them are rewarded (GRPO over the group).",
    )
    baseline_window: int = Field(
        64, ge=2, description="A session without a group key is trained alone against the rewards of the last "
        "this-many rewarded ungrouped sessions (its own included): the trainer's estimator with that window's "
        "mean and std as the group statistics (a moving baseline).",
    )
    max_open_sessions: int = Field(
        1000, ge=1, description="Sessions one application may hold (not yet published or expired: rewarded ones "
        "waiting for their group count too); past it creating one is refused (HTTP 429).",
    )
    requests_per_min: int = Field(600, ge=1, description="Requests one application may send per minute (HTTP 429 past it).")
    tokens_per_min: int = Field(
        200_000, ge=1, description="Prompt + generated tokens one application may use per minute; a request "
        "while its budget is spent is refused (HTTP 429).",
    )
    max_record_bytes: int = Field(
        4 * 1024 * 1024, ge=4096, description="Largest session record (its calls, msgpack); a call that would "
        "grow it past this is refused (HTTP 400) and the session can only be rewarded.",
    )
