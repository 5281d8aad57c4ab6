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
    delta: bool = Field(
        True, description="Delta versions (docs/weight_store.md): the service writes, at each commit of a full "
        "model, its difference from the run's previous version (changed bits, zstd-compressed); a client that "
        "holds that previous version in cache_dir downloads the delta instead of the whole version and checks "
        "every rebuilt file against the manifest (falling back to the full download). false: neither side uses them.")
    delta_level: int = Field(3, ge=1, le=22, description="Service: zstd level of delta blobs (higher = smaller, slower).")
    delta_max_ratio: float = Field(
        0.5, gt=0, le=1, description="Service: write a delta only when it is below this share of the full "
        "version's bytes.")
    fanout: Literal["store", "relay"] = Field(
        "relay", description="How an HTTP fetch of a full version travels (docs/weight_store.md, Relay fan-out): "
        "store = every worker downloads it from the store; relay = the store chains the workers fetching a "
        "version, each takes pieces from the worker before it (checked against the store's piece digests) and "
        "serves them on to the next, so each byte leaves the store about once (8 hosts on 100 Mbit/s links: "
        "1.14 x one link's time against 8.37 x for store; docs/benchmarks.md). Other workers must reach "
        "relay_port; where they cannot, a worker falls back to the store after relay_max_failures.")
    piece_kb: int = Field(
        256, ge=4, le=1 << 20, description="Service: piece size of a version for relay fan-out (KiB). A relay "
        "forwards a piece once it has all of it, so each hop adds about relay_window pieces' time on its link: "
        "smaller pieces, shorter chains; more requests.")
    relay_min_mb: int = Field(
        32, ge=0, description="fanout=relay: versions smaller than this (MiB) come straight from the store: for a "
        "small version the chain's start-up and per-hop latency cost more than the store's link saves (a worker "
        "joining a run of the tiny demo model was ~1 s slower to its first version through the chain).")
    relay_window: int = Field(2, ge=1, le=64, description="fanout=relay: pieces requested from the upstream at once.")
    relay_host: str = Field("0.0.0.0", description="fanout=relay: bind address of this worker's relay server.")
    relay_port: int = Field(0, ge=0, le=65535, description="fanout=relay: its port (0 = a free port).")
    relay_advertise: str = Field(
        "", description="fanout=relay: the URL other workers reach this relay at ('' = http://<the address this "
        "host uses to reach the store>:<port>).")
    relay_timeout_s: float = Field(
        10.0, gt=0, description="fanout=relay: a piece not received from the upstream worker in this time is "
        "taken elsewhere (the store assigns a new upstream; the slow one is reported).")
    relay_max_failures: int = Field(
        3, ge=0, description="fanout=relay: upstream failures (dead, slow, a piece that fails its digest) after "
        "which the rest of the version comes from the store.")
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
