"""Controller: REST API, database, data dir, release pacing."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from shared.config.base import Section


class ControllerConfig(Section):
    SECTION: ClassVar[str] = "controller"

    url: str = Field("http://127.0.0.1:8600", description="Base URL clients (CLI, services) use to reach the controller.")
    host: str = Field("127.0.0.1", description="Bind address of `jetrl controller`.")
    port: int = Field(8600, ge=0, le=65535, description="Port of `jetrl controller`.")
    db_url: str = Field(
        "sqlite:///jetrl.db", description="SQLAlchemy URL: sqlite:///FILE or postgresql+psycopg://user@host/db."
    )
    data_dir: str = Field("jetrl-data", description="Where uploaded datasets are stored.")
    token: str = Field(
        "", json_schema_extra={"secret": True},
        description="Bearer token every /v1 route but /v1/health requires (reads too). Prefer token_file. The "
        "controller refuses to start without one unless insecure_no_auth is true.",
    )
    token_file: str = Field("", description="File holding controller.token (mode 0600; `jetrl up` writes one per run).")
    insecure_no_auth: bool = Field(
        False, description="Serve without a token: anyone who reaches the port reads and writes. Logged as a warning; "
        "for a throwaway loopback setup only.",
    )
    verify_weights: bool = Field(
        True, description="Act on an announced weight version (admission bound, current version) only when the "
        "weight store (weights.url, weights.read_token) holds it with the announced manifest digest and versions "
        "only go up (controller/release.py, VersionGate); a refusal is a `weights_refused` event. false: trust the KV.",
    )
    max_upload_mb: int = Field(
        4096, ge=1, description="Largest dataset file accepted by upload or by server-side path, in MiB."
    )
    max_line_kb: int = Field(
        8192, ge=1, description="Longest JSONL line (one dataset row) accepted, in KiB (NATS max_payload caps a prompt)."
    )
    max_dataset_mb: int = Field(
        4096, ge=1, description="Most data one dataset may decompress to, in MiB, counted while it is read (JSONL "
        "lines after gzip/bz2/xz, Parquet record batches, Hugging Face rows): the read stops with a 413 at the limit.",
    )
    max_expansion_ratio: float = Field(
        100.0, ge=0, description="A compressed source (Parquet, .gz/.bz2/.xz JSONL, local Hugging Face files) may "
        "decompress to at most this many times its size on disk (and at least 1 MiB) before the read stops with a "
        "413: a 1 KB Parquet file of 50 x 8 MB rows is refused after its first MiB. 0 = only max_dataset_mb.",
    )
    max_errors: int = Field(10, ge=1, le=1000, description="Validation reports at most this many bad rows.")
    path_roots: list[str] = Field(
        default_factory=list,
        description="Dirs server-side datasets may be read from: /v1/datasets/path and every local file or dir any "
        "/v1/datasets/hf builder reads must lie under one of them, symlinks resolved and globs expanded first; a "
        "relative path is taken relative to the first root ([] = no server-side paths; upload instead).",
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
    diagnosis_alive_s: float = Field(
        15.0, gt=0, description="`jetrl why` (controller/diagnosis.py) counts a service dead when its last health "
        "event is older than this or 3 x telemetry.events_interval_s, whichever is larger.",
    )
    diagnosis_stall_s: float = Field(
        30.0, gt=0, description="`jetrl why` calls a run stalled, and a trainer outside its wait for groups stuck, "
        "after no step for this long or 2 x the median step time, whichever is larger.",
    )
