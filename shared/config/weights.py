"""Weight store: where versions live and how clients reach them."""

from __future__ import annotations

from pydantic import Field

from shared.config.base import Section


class WeightStoreConfig(Section):
    url: str = Field("http://127.0.0.1:8700", description="Base URL of the weight store HTTP service.")
    root: str = Field("jetrl-weights", description="Directory the service stores versions in.")
    host: str = Field("127.0.0.1", description="Bind address of `jetrl weights serve`.")
    port: int = Field(8700, ge=0, le=65535, description="Port of `jetrl weights serve` (0 = a free port).")
    token: str = Field("", description="Bearer token required for writes ('' = writes open).")
    read_token: str = Field("", description="Bearer token required for reads ('' = reads open).")
    keep_last: int = Field(3, ge=1, description="Retention: keep the newest K versions of a run (plus pinned).")
    shared_fs: bool = Field(
        True, description="Clients read files in place when `root` is mounted on their host (zero copies)."
    )
    cache_dir: str = Field("", description="Where HTTP fetches land ('' = a dir under the system temp dir).")
    shard_size_mb: int = Field(512, ge=1, description="Largest safetensors shard the client writes.")
    max_file_mb: int = Field(16384, ge=1, description="Largest file the service accepts in one upload.")
