"""Weight store: where versions live and how clients reach them (docs/weight_store.md)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from shared.config.base import Section


class WeightStoreConfig(Section):
    SECTION: ClassVar[str] = "weights"

    url: str = Field("http://127.0.0.1:8700", description="Base URL of the weight store HTTP service.")
    root: str = Field(
        "jetrl-weights",
        description="Directory the service stores versions in; on a client, where that directory is mounted "
        "(used in place when `shared_fs` is on and it holds the version).",
    )
    host: str = Field("127.0.0.1", description="Bind address of `jetrl weights serve`.")
    port: int = Field(8700, ge=0, le=65535, description="Port of `jetrl weights serve` (0 = a free port).")
    token: str = Field(
        "", json_schema_extra={"secret": True},
        description="Bearer token for writes (and reads, which also accept read_token). Prefer token_file. The "
        "service refuses to start without one unless insecure_no_auth is true.",
    )
    token_file: str = Field("", description="File holding weights.token (mode 0600; `jetrl up` writes one per run).")
    read_token: str = Field(
        "", json_schema_extra={"secret": True},
        description="A second bearer token that allows reads only (for rollout workers); reads always accept token.",
    )
    read_token_file: str = Field("", description="File holding weights.read_token.")
    insecure_no_auth: bool = Field(
        False, description="Serve without a token: anyone who reaches the port reads and writes weights. Logged as a "
        "warning; for a throwaway loopback setup only.",
    )
    keep_last: int = Field(3, ge=1, description="Retention: keep the newest K versions of a run (plus pinned).")
    shared_fs: bool = Field(
        True, description="Clients read files in place when `root` is mounted on their host (zero copies)."
    )
    verify_shared_sha256: bool = Field(
        True, description="Shared filesystem: check every file's sha256 against the manifest before it is used "
        "(sizes are always checked). Costs one read of the version per reader (docs/weight_store.md has the "
        "figure); false trusts the shared filesystem's bytes.",
    )
    verify_sha256: bool = Field(True, description="HTTP fetch: check every downloaded file's digest (`digest`).")
    digest: Literal["xxh3_128", "sha256"] = Field(
        "xxh3_128", description="The digest a fetch or a shared-filesystem read checks each file against: xxh3_128 "
        "(from the manifest; ~26 GB/s on one core, catches corruption and truncation) or sha256 (cryptographic, "
        "~1.7 GB/s on one core with SHA-NI). A manifest without xxh3_128 (an older store, the directory publisher "
        "of an older trainer) is checked with sha256. Uploads are always checked with sha256.")
    cache_dir: str = Field("", description="Where HTTP fetches land ('' = a dir under the system temp dir).")
    cache_keep: int = Field(2, ge=1, description="HTTP fetches: newest versions of a run kept in cache_dir.")
    shard_size_mb: int = Field(256, ge=1, description="Largest safetensors shard the client writes.")
    max_file_mb: int = Field(16384, ge=1, description="Largest file the service accepts in one upload.")
    max_files: int = Field(1024, ge=1, description="Most files one version may hold.")
    max_versions_per_run: int = Field(
        0, ge=0, description="Refuse commits when a run already holds this many versions (0 = no limit)."
    )
    parallel_transfers: int = Field(4, ge=1, le=64, description="Files a client uploads or downloads at once.")
    chunk_mb: int = Field(8, ge=1, le=256, description="Buffer size of one read/write in transfers (MiB).")
    timeout_s: float = Field(60.0, gt=0, description="Client: socket timeout of one HTTP request.")
    retries: int = Field(3, ge=0, description="Client: retries of a failed transfer (downloads resume).")
    fsync: bool = Field(
        False, description="Service: fsync files before a commit's rename (survives an OS crash; slower)."
    )
    staging_ttl_s: float = Field(
        3600.0, gt=0, description="Service: uploads not committed within this time are discarded."
    )
