"""Controller: REST API, database, data dir, release pacing."""

from __future__ import annotations

from pydantic import Field

from shared.config.base import Section


class ControllerConfig(Section):
    url: str = Field("http://127.0.0.1:8600", description="Base URL clients (CLI, services) use to reach the controller.")
    host: str = Field("127.0.0.1", description="Bind address of `jetrl controller`.")
    port: int = Field(8600, ge=0, le=65535, description="Port of `jetrl controller`.")
    db_url: str = Field(
        "sqlite:///jetrl.db", description="SQLAlchemy URL: sqlite:///FILE or postgresql+psycopg://user@host/db."
    )
    data_dir: str = Field("jetrl-data", description="Where uploaded datasets are stored.")
    token: str = Field("", description="Bearer token required for writes ('' = writes open).")
    max_upload_mb: int = Field(
        4096, ge=1, description="Largest dataset file accepted by upload or by server-side path, in MiB."
    )
    max_line_kb: int = Field(
        8192, ge=1, description="Longest JSONL line (one dataset row) accepted, in KiB (NATS max_payload caps a prompt)."
    )
    max_errors: int = Field(10, ge=1, le=1000, description="Validation reports at most this many bad rows.")
    path_roots: list[str] = Field(
        default_factory=list,
        description="Server-side dataset paths must lie under one of these dirs ([] = any readable path).",
    )
    hf_cache_dir: str = Field("", description="Cache dir of the `datasets` library ('' = <data_dir>/hf-cache).")
    release_batch: int = Field(500, ge=1, le=100_000, description="Prompts written to the ledger and published per batch.")
    release_rate: float = Field(
        0.0, ge=0, description="Cap on prompts released per second per run (0 = as fast as admission allows)."
    )
    publish_timeout_s: float = Field(30.0, gt=0, description="Time to wait for JetStream to ack a batch of prompts.")
    poll_interval_s: float = Field(
        1.0, gt=0, description="The release loop re-checks admission at least this often, besides bus wake-ups."
    )
