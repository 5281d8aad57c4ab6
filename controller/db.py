"""The controller's SQL schema (SQLAlchemy 2.x): datasets, runs, enqueues, the prompt ledger, weight
versions, metrics, events, service health, prompt memory (per-group observations and per-prompt totals)
and each run's learning-signal state. SQLite by default, PostgreSQL by URL.

Times are unix seconds (floats) so both databases store them the same way. `open_database(url)` creates
the schema at start-up and refuses a database written by a newer jetrl (SCHEMA_VERSION).
"""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    create_engine,
    event,
    inspect,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

SCHEMA_VERSION = 1

# Ledger states. A group moves only forward: released -> received -> one end state
# (dead_lettered may also follow released directly).
RELEASED = "released"
RECEIVED = "received"
TRAINED = "trained"
DROPPED_STALE = "dropped_stale"
FILTERED = "filtered"
DEAD_LETTERED = "dead_lettered"
LEDGER_STATES = (RELEASED, RECEIVED, TRAINED, DROPPED_STALE, FILTERED, DEAD_LETTERED)
# Groups in these states no longer count against the admission bound (their work was thrown away).
FREED_STATES = (DROPPED_STALE, FILTERED, DEAD_LETTERED)


def now() -> float:
    return time.time()


class Base(DeclarativeBase):
    pass


class Meta(Base):
    __tablename__ = "jetrl_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))


class Dataset(Base):
    __tablename__ = "datasets"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(256))
    content_hash: Mapped[str] = mapped_column(String(64), unique=True)
    source: Mapped[str] = mapped_column(String(16))  # upload | path | hf
    source_ref: Mapped[str] = mapped_column(Text)  # file name, server path or hf:name/split
    format: Mapped[str] = mapped_column(String(16))  # jsonl | parquet | hf
    mapping: Mapped[dict] = mapped_column(JSON)
    num_rows: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)  # the normalized JSONL the release reads
    created_at: Mapped[float] = mapped_column(Float, default=now)


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    config: Mapped[dict] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="running")
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    current_version: Mapped[int] = mapped_column(Integer, default=-1)  # -1: no weights announced yet
    release_seq: Mapped[int] = mapped_column(Integer, default=0)  # last ledger seq handed out
    published_seq: Mapped[int] = mapped_column(Integer, default=0)  # every seq <= this is acked by JetStream


class Enqueue(Base):
    __tablename__ = "enqueues"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"))
    request_key: Mapped[str] = mapped_column(String(200), unique=True)  # idempotency of re-enqueues
    epochs: Mapped[int] = mapped_column(Integer)
    shuffle_seed: Mapped[int | None] = mapped_column(Integer, nullable=True)
    limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    epoch_offset: Mapped[int] = mapped_column(Integer)
    rows_per_epoch: Mapped[int] = mapped_column(Integer)
    total: Mapped[int] = mapped_column(Integer)
    next_pos: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float, default=now)


class Ledger(Base):
    __tablename__ = "prompt_ledger"
    group_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64))
    enqueue_id: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[int] = mapped_column(Integer)
    prompt_id: Mapped[str] = mapped_column(String(128))
    row_index: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    released_at_version: Mapped[int] = mapped_column(Integer)
    released_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    trained_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)

    __table_args__ = (
        Index("ix_ledger_run_seq", "run_id", "seq"),
        Index("ix_ledger_run_state", "run_id", "state"),
    )


class WeightVersionRow(Base):
    __tablename__ = "weight_versions"
    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int] = mapped_column(Integer, default=0)
    # WeightVersion.short: groups the steps behind it trained short of a batch (null in databases of
    # controllers before 0.11.1: read as 0)
    short: Mapped[int | None] = mapped_column(Integer, nullable=True, default=0)
    manifest_url: Mapped[str] = mapped_column(Text, default="")
    sha256: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[float] = mapped_column(Float, default=now)
    seen_at: Mapped[float] = mapped_column(Float, default=now)


class Metric(Base):
    __tablename__ = "metrics"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(64))
    service: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(128))
    x: Mapped[float] = mapped_column(Float)  # trainer: version; others: event time
    value: Mapped[float] = mapped_column(Float)
    time: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index("ix_metrics_run_name", "run_id", "name", "id"),)


class EventRow(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(64))
    service: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(64))
    instance: Mapped[str] = mapped_column(String(200), default="")
    time: Mapped[float] = mapped_column(Float)
    data: Mapped[dict] = mapped_column(JSON)
    stream: Mapped[str] = mapped_column(String(32), default="")
    stream_seq: Mapped[int | None] = mapped_column(Integer, nullable=True)  # redeliveries are not stored twice

    __table_args__ = (
        Index("ix_events_run_id", "run_id", "id"),
        Index("ix_events_run_kind", "run_id", "kind", "id"),  # the newest events of a kind (`jetrl why`)
        Index("ux_events_stream_seq", "run_id", "stream", "stream_seq", unique=True),
    )


class Health(Base):
    __tablename__ = "service_health"
    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    service: Mapped[str] = mapped_column(String(64), primary_key=True)
    instance: Mapped[str] = mapped_column(String(200), primary_key=True)
    status: Mapped[str] = mapped_column(String(32))
    last_seen: Mapped[float] = mapped_column(Float)
    data: Mapped[dict] = mapped_column(JSON)


class PromptObservation(Base):
    """One row per group whose trajectory arrived (rollout "published" event, `prompts` field): what the
    rollout saw for that prompt at that time. The group id key makes a redelivered or repeated report
    count once (controller/memory.py)."""

    __tablename__ = "prompt_observations"
    group_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64))
    prompt_id: Mapped[str] = mapped_column(String(128))
    dataset_key: Mapped[str] = mapped_column(String(64))  # the prompt id before its last '-': content hash[:12]
    epoch: Mapped[int] = mapped_column(Integer)
    drawn: Mapped[int] = mapped_column(Integer)  # samples generated for the group (adaptive sampling: more)
    successes: Mapped[int] = mapped_column(Integer)  # samples with reward >= the rollout's success threshold
    reward_mean: Mapped[float] = mapped_column(Float)  # over every drawn sample
    signal: Mapped[bool] = mapped_column(Boolean)  # the drawn rewards had a spread
    version: Mapped[int] = mapped_column(Integer)  # newest policy version among the group's tokens
    time: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        Index("ix_obs_run_version", "run_id", "version"),
        Index("ix_obs_dataset", "dataset_key"),
    )


class PromptMemory(Base):
    """Per prompt id, over every run: the totals of its observations and its last one. Prompt ids are
    `<content hash[:12]>-<row>`, so a second run on the same data reads the first one's memory."""

    __tablename__ = "prompt_memory"
    prompt_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    dataset_key: Mapped[str] = mapped_column(String(64))
    sampled: Mapped[int] = mapped_column(Integer, default=0)  # sum of drawn
    successes: Mapped[int] = mapped_column(Integer, default=0)
    groups: Mapped[int] = mapped_column(Integer, default=0)
    signal_groups: Mapped[int] = mapped_column(Integer, default=0)  # groups whose rewards had a spread
    reward_sum: Mapped[float] = mapped_column(Float, default=0.0)  # sum of reward_mean x drawn
    solve_rate: Mapped[float] = mapped_column(Float, default=0.0)  # successes / sampled
    last_version: Mapped[int] = mapped_column(Integer, default=-1)  # the newest version it was observed at
    last_run: Mapped[str] = mapped_column(String(64), default="")
    last_signal: Mapped[bool] = mapped_column(Boolean, default=False)
    last_successes: Mapped[int] = mapped_column(Integer, default=0)
    last_drawn: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[float] = mapped_column(Float, default=now)

    __table_args__ = (Index("ix_memory_dataset_updated", "dataset_key", "updated_at"),)


class RunSignal(Base):
    """The trainer's latest "no_signal" report of a run (the one with the highest step wins)."""

    __tablename__ = "run_signal"
    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    no_signal: Mapped[bool] = mapped_column(Boolean)
    step: Mapped[int] = mapped_column(Integer)
    since_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    groups: Mapped[int | None] = mapped_column(Integer, nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")
    updated_at: Mapped[float] = mapped_column(Float, default=now)


def upsert(s, table, rows: list[dict], keys: list[str], set_: dict, where=None):
    """INSERT ... ON CONFLICT (keys) DO UPDATE SET set_ [WHERE where] (set_ / where given a function of
    the `excluded` row), or DO NOTHING when set_ is empty; PostgreSQL and SQLite (>= 3.24) alike."""
    dialect = postgresql if s.get_bind().dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(table).values(rows)
    if not set_:
        return stmt.on_conflict_do_nothing(index_elements=keys)
    ex = stmt.excluded
    return stmt.on_conflict_do_update(index_elements=keys, set_=set_(ex) if callable(set_) else set_,
                                      where=where(ex) if where is not None else None)


class SchemaTooNew(RuntimeError):
    pass


def _private_sqlite_file(path: Path) -> None:
    """Create the database file (and make an existing one) readable by its owner only: it holds run
    configs, dataset paths and every event. SQLite gives its -wal and -shm files the database's mode."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if p.exists():
            os.chmod(p, 0o600)


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite gets WAL, a busy timeout and its parent dir created."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            _private_sqlite_file(Path(u.database).expanduser())
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:  # pragma: no cover - exercised by every sqlite test
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=8, max_overflow=8)


def _add_new_columns(engine: Engine) -> None:
    """Nullable columns added to a table since a database was made (create_all skips existing tables):
    ALTER TABLE ... ADD COLUMN, which SQLite and PostgreSQL both do in place."""
    insp = inspect(engine)
    for table in Base.metadata.sorted_tables:
        if not insp.has_table(table.name):
            continue
        have = {c["name"] for c in insp.get_columns(table.name)}
        for col in table.columns:
            if col.name not in have and col.nullable:
                kind = col.type.compile(dialect=engine.dialect)
                with engine.begin() as conn:
                    conn.execute(text(f'ALTER TABLE {table.name} ADD COLUMN "{col.name}" {kind}'))


def open_database(url: str) -> tuple[Engine, sessionmaker]:
    """Connect, create missing tables, record/check the schema version. Returns (engine, Session)."""
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    for idx in EventRow.__table__.indexes:  # indexes added since a table was made (create_all skips the table)
        idx.create(engine, checkfirst=True)
    _add_new_columns(engine)
    Session = sessionmaker(engine, expire_on_commit=False)
    with Session.begin() as s:
        row = s.get(Meta, "schema_version")
        if row is None:
            s.add(Meta(key="schema_version", value=str(SCHEMA_VERSION)))
        elif int(row.value) > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"database {engine.url.render_as_string(hide_password=True)} has schema version {row.value}, "
                f"newer than this controller's {SCHEMA_VERSION}: upgrade jetrl"
            )
    return engine, Session
