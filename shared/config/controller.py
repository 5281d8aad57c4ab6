"""Controller: REST API, database, data dir."""

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
