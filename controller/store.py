"""What the REST routes do to the database: register datasets, create and steer runs, enqueue, read.

Every failure a client can cause is an `ApiError(status, message)` whose message says what to fix;
api.py turns it into the HTTP answer. Functions are synchronous (FastAPI runs them in its threadpool).
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from controller import completion, ledger, no_signal
from controller.datasets import Normalized
from controller.db import Dataset, Enqueue, EventRow, Health, Metric, Run, WeightVersionRow, now
from shared.config import JetrlConfig
from shared.io.jsonl import JSONInputError, check_plain, loads_strict, nesting_depth


class ApiError(Exception):
    def __init__(self, status: int, message: str, **extra):
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


# --- datasets -------------------------------------------------------------------------------------


def dataset_dict(d: Dataset) -> dict:
    return {"id": d.id, "name": d.name, "content_hash": d.content_hash, "source": d.source,
            "source_ref": d.source_ref, "format": d.format, "mapping": d.mapping, "num_rows": d.num_rows,
            "created_at": d.created_at}


def register_dataset(Session_, norm: Normalized, name: str, source: str, source_ref: str, fmt: str) -> tuple[dict, bool]:
    """The dataset with this content (created when new). Same content registered again -> same dataset."""
    with Session_() as s:
        existing = s.scalar(select(Dataset).where(Dataset.content_hash == norm.content_hash))
        if existing is not None:
            return dataset_dict(existing), False
    try:
        with Session_.begin() as s:
            d = Dataset(name=name[:256] or norm.content_hash[:12], content_hash=norm.content_hash, source=source,
                        source_ref=source_ref, format=fmt, mapping=norm.mapping.model_dump(), num_rows=norm.num_rows,
                        path=norm.path, created_at=now())
            s.add(d)
            s.flush()
            return dataset_dict(d), True
    except IntegrityError:  # registered concurrently
        with Session_() as s:
            return dataset_dict(s.scalar(select(Dataset).where(Dataset.content_hash == norm.content_hash))), False


def find_dataset(s: Session, ref: str) -> Dataset:
    """A dataset by id, content hash (or a unique prefix of >= 8 hex digits), or name."""
    ref = str(ref).strip()
    d = None
    if ref.isascii() and ref.isdigit() and len(ref) < 12:
        d = s.get(Dataset, int(ref))
    if d is None and len(ref) >= 8 and all(c in "0123456789abcdef" for c in ref.lower()):
        hits = list(s.scalars(select(Dataset).where(Dataset.content_hash.startswith(ref.lower())).limit(2)))
        if len(hits) == 1:
            d = hits[0]
    if d is None:
        hits = list(s.scalars(select(Dataset).where(Dataset.name == ref).order_by(Dataset.id.desc()).limit(1)))
        d = hits[0] if hits else None
    if d is None:
        raise ApiError(404, f"dataset {ref!r} not found: use an id, content hash or name from GET /v1/datasets")
    return d


# --- runs -----------------------------------------------------------------------------------------


MAX_CONFIG_DEPTH = 32


def parse_run_config(body: bytes, content_type: str) -> JetrlConfig:
    """A run config from a JSON or YAML request body, validated like the CLI's config files. YAML aliases
    are refused (a few hundred bytes of nested aliases expand to gigabytes), and so are nesting deeper than
    MAX_CONFIG_DEPTH, NaN / Infinity and integers outside 64 bits (shared/io/jsonl.py: loads_strict, check_plain)."""
    import yaml
    from pydantic import ValidationError

    from shared.config import safe_yaml_load

    text = body.decode("utf-8", errors="replace")
    kind = "JSON" if "json" in content_type else "YAML"
    try:
        data = loads_strict(text, MAX_CONFIG_DEPTH) if kind == "JSON" else safe_yaml_load(text)
    except RecursionError:
        raise ApiError(400, f"run config is not valid {kind}: nested too deeply") from None
    except (ValueError, yaml.YAMLError) as exc:  # ValueError: JSONInputError, or YAML's 4300-digit int
        raise ApiError(400, f"run config is not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(422, "run config must be a mapping of sections (run, schedule, rollout, ...)")
    if nesting_depth(data, MAX_CONFIG_DEPTH) > MAX_CONFIG_DEPTH:
        raise ApiError(422, f"run config is nested deeper than {MAX_CONFIG_DEPTH} levels: flatten it")
    try:
        check_plain(data, MAX_CONFIG_DEPTH)
    except JSONInputError as exc:
        raise ApiError(422, f"run config: {exc}") from None
    try:
        return JetrlConfig.model_validate(data)
    except ValidationError as exc:
        errs = exc.errors()
        first = errs[0]
        field = ".".join(str(p) for p in first["loc"]) or "config"
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        raise ApiError(422, f"run config field {field}: {first['msg']}{more}",
                       errors=[{"field": ".".join(str(p) for p in e["loc"]), "error": e["msg"]} for e in errs[:20]]
                       ) from None


def run_dict(s: Session, r: Run) -> dict:
    cfg = r.config
    sched = cfg.get("schedule", {})
    ms, bs = sched.get("max_staleness", 4), sched.get("batch_size", 8)
    step, bound = ledger.run_bound(s, r.id, cfg, r.current_version)
    prog = completion.progress(s, r.id)
    return {"id": r.id, "status": r.status, "created_at": r.created_at, "updated_at": r.updated_at,
            "current_version": r.current_version, "max_staleness": ms, "batch_size": bs,
            "current_step": step, "admission_bound": bound,
            "enqueued": prog["enqueued"], "ledger": prog["ledger"], "signal": no_signal.state(s, r.id),
            "progress": {"state": prog["state"], "complete": prog["state"] == "complete"}}


def get_run(s: Session, run_id: str) -> Run:
    r = s.get(Run, run_id)
    if r is None:
        raise ApiError(404, f"run {run_id!r} not found: create it with POST /v1/runs (a run config body)")
    return r


def create_run(Session_, cfg: JetrlConfig) -> tuple[dict, bool]:
    """Store the run's config with its secrets (tokens, NATS password) redacted: the database only needs
    the schedule and the algorithm, and is read by more people than the services' secrets are."""
    from shared.runtime.credentials import redacted_dump

    data = redacted_dump(cfg)
    with Session_.begin() as s:
        r = s.get(Run, cfg.run)
        if r is not None:
            if r.config != data:
                raise ApiError(409, f"run {cfg.run!r} exists with a different config: choose another run id, "
                                    f"or send the same config to get the existing run")
            return run_dict(s, r), False
    try:
        with Session_.begin() as s:
            r = Run(id=cfg.run, config=data, status="running", created_at=now(), updated_at=now())
            s.add(r)
            s.flush()
            return run_dict(s, r), True
    except IntegrityError:
        return create_run(Session_, cfg)


ACTIONS = {"pause": ("running",), "resume": ("paused",), "stop": ("running", "paused")}
AFTER = {"pause": "paused", "resume": "running", "stop": "stopped"}


def set_status(Session_, run_id: str, action: str) -> dict:
    with Session_.begin() as s:
        r = get_run(s, run_id)
        target = AFTER[action]
        if r.status != target:
            if r.status not in ACTIONS[action]:
                raise ApiError(409, f"run {run_id!r} is {r.status}: cannot {action} it "
                                    f"(allowed from {', '.join(ACTIONS[action])})")
            r.status, r.updated_at = target, now()
        return run_dict(s, r)


def enqueue(Session_, run_id: str, dataset_ref: str, epochs: int, shuffle_seed: int | None,
            limit: int | None) -> tuple[dict, bool]:
    """Add a dataset's prompts to a run. The same request again is the same enqueue (idempotent); a new
    request for the same dataset continues with the next epochs, so no group id repeats."""
    try:
        with Session_.begin() as s:
            r = get_run(s, run_id)
            if r.status == "stopped":
                raise ApiError(409, f"run {run_id!r} is stopped: enqueue into a running or paused run")
            d = find_dataset(s, dataset_ref)
            key = f"{run_id}|{d.id}|{epochs}|{shuffle_seed}|{limit}"
            existing = s.scalar(select(Enqueue).where(Enqueue.request_key == key))
            if existing is not None:
                return enqueue_dict(existing), False
            prev = s.scalar(select(func.coalesce(func.max(Enqueue.epoch_offset + Enqueue.epochs), 0))
                            .where(Enqueue.run_id == run_id, Enqueue.dataset_id == d.id)) or 0
            rpe = min(d.num_rows, limit) if limit else d.num_rows
            e = Enqueue(run_id=run_id, dataset_id=d.id, request_key=key, epochs=epochs, shuffle_seed=shuffle_seed,
                        limit=limit, epoch_offset=int(prev), rows_per_epoch=rpe, total=rpe * epochs, next_pos=0,
                        created_at=now())
            s.add(e)
            s.flush()
            return enqueue_dict(e), True
    except IntegrityError:  # the same request raced in
        with Session_() as s:
            return enqueue_dict(s.scalar(select(Enqueue).where(Enqueue.request_key == key))), False


def enqueue_dict(e: Enqueue) -> dict:
    return {"id": e.id, "run": e.run_id, "dataset_id": e.dataset_id, "epochs": e.epochs,
            "shuffle_seed": e.shuffle_seed, "limit": e.limit, "first_epoch": e.epoch_offset,
            "rows_per_epoch": e.rows_per_epoch, "total": e.total, "released": e.next_pos, "created_at": e.created_at}


# --- reads ----------------------------------------------------------------------------------------


def versions(s: Session, run_id: str) -> list[dict]:
    rows = s.scalars(select(WeightVersionRow).where(WeightVersionRow.run_id == run_id).order_by(WeightVersionRow.version))
    return [{"version": w.version, "step": w.step, "manifest_url": w.manifest_url, "sha256": w.sha256,
             "created_at": w.created_at, "seen_at": w.seen_at, "short": w.short or 0} for w in rows]


def metric_series(s: Session, run_id: str, names: list[str], limit: int) -> dict[str, list[list[float]]]:
    """{"<service>.<name>": [[x, value], ...]} (x = version for trainer metrics, unix time for others)."""
    # Plain rows, not ORM objects: the dashboard reads up to `limit` rows every 2 s, and building 20,000
    # Metric objects took ~4x as long as the query itself (docs/benchmarks.md, "Observability overhead").
    q = select(Metric.id, Metric.service, Metric.name, Metric.x, Metric.value).where(Metric.run_id == run_id)
    if names:
        q = q.where(Metric.name.in_(names))
    rows = s.execute(q.order_by(Metric.id.desc()).limit(limit)).all()
    rows.sort(key=lambda m: (m.x, m.id))  # events are stored concurrently: order by x
    out: dict[str, list[list[float]]] = defaultdict(list)
    for m in rows:
        out[f"{m.service}.{m.name}"].append([m.x, m.value])
    return dict(out)


def staleness_hist(s: Session, run_id: str, last: int = 0) -> dict[str, int]:
    """Staleness histogram summed over the trainer's step events (the last `last` steps, 0 = all)."""
    q = select(EventRow.data).where(EventRow.run_id == run_id, EventRow.kind == "step").order_by(EventRow.id.desc())
    if last:
        q = q.limit(last)
    hist: dict[int, int] = defaultdict(int)
    for data in s.scalars(q):
        h = data.get("staleness_hist") if isinstance(data, dict) else None
        if isinstance(h, dict):
            for k, v in h.items():
                try:
                    hist[int(k)] += int(v)
                except (TypeError, ValueError):
                    continue
    return {str(k): hist[k] for k in sorted(hist)}


STEP_ORDER_SLACK = 512  # > the follower's events in flight (batch 64 x 4)


def _num(x) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else -1.0


def stage_timings(s: Session, run_id: str, last: int = 0) -> dict:
    """Per-version stage timings of the last `last` step events (0 = all): controller/timings.py."""
    from controller.timings import stage_table

    q = select(EventRow.data).where(EventRow.run_id == run_id, EventRow.kind == "step").order_by(EventRow.id.desc())
    # The follower stores a batch of events concurrently, so row order is not step order: take enough of
    # the newest rows to cover its in-flight window, order them by step, keep the last `last`.
    rows = [d for d in s.scalars(q.limit(last + STEP_ORDER_SLACK) if last else q) if isinstance(d, dict)]
    rows.sort(key=lambda d: (_num(d.get("step")), _num(d.get("version"))))
    steps = rows[-last:] if last else rows
    versions = [d.get("version") for d in steps]
    w = select(EventRow.data).where(EventRow.run_id == run_id, EventRow.kind == "weights")
    weights = [d for d in s.scalars(w) if isinstance(d, dict) and (not last or d.get("version") in versions)]
    return stage_table(steps, weights)


def events(s: Session, run_id: str, kind: str | None, service: str | None, after: int, limit: int) -> list[dict]:
    q = select(EventRow).where(EventRow.run_id == run_id, EventRow.id > after)
    if kind:
        q = q.where(EventRow.kind == kind)
    if service:
        q = q.where(EventRow.service == service)
    return [{"id": e.id, "service": e.service, "kind": e.kind, "instance": e.instance, "time": e.time, "data": e.data}
            for e in s.scalars(q.order_by(EventRow.id).limit(limit))]


def health(s: Session, stale_after_s: float) -> list[dict]:
    t = now()
    return [{"run": h.run_id, "service": h.service, "instance": h.instance, "status": h.status,
             "last_seen": h.last_seen, "age_s": round(t - h.last_seen, 3),
             "alive": (t - h.last_seen) <= stale_after_s, "data": h.data}
            for h in s.scalars(select(Health).order_by(Health.run_id, Health.service, Health.instance))]
