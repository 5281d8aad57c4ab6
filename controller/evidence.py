"""The evidence `diagnosis.diagnose` reads: one snapshot of a run from the database, the bus and the weight store.

Fields (all times are Unix seconds):

- `now`; `run`: id, status, current_version, batch_size, max_staleness, events_interval_s, reward_task,
  online (a serve-policy process reports: the run's prompts come from live traffic, not enqueues);
- `progress`: completion.progress (state, enqueued, ledger summary); `admission`: {bound, outstanding};
- `health`: every health report of the run ({service, instance, last_seen, data}); the services put what
  they are doing there: the trainer `phase` / `phase_since` / `publish_error`, a rollout worker `version`,
  `announced`, `in_flight`, `fetch_error`, `last_error` / `last_error_at`;
- `steps`: the last STEPS trainer steps ({time, step, version, wall_s}); `trainer_started`: its last
  started / resumed event; `current_version_since`: when the controller first saw the current version;
- `last_published`: the last rollout "published" event; `outcomes`: trained / dropped_stale / filtered
  group counts of the trainer's last OUTCOME_EVENTS "groups" events within WINDOW_S;
- `oldest_in_flight`: the OLDEST groups still released or received ({group_id, state, since});
- `dead_letters`: {recent, window_s, reasons: [[reason, count], ...]} over WINDOW_S;
- `warnings`: recent events of WARNING_KINDS; `signal`: no_signal.state; `guard`: the trainer's last
  `guard_tripped` event (its data and time) or None;
- `queues`: Controller.queue_depths; `store`: {ok, error, url} from asking the weight store for the run's
  versions; `nats`: {storage, storage_max} of the JetStream account (or {error}); `limits`: the
  controller's diagnosis_alive_s / diagnosis_stall_s.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from sqlalchemy import func, select

from controller import completion, ledger, no_signal, store
from controller.db import RECEIVED, RELEASED, EventRow, Health, Ledger, WeightVersionRow

STEPS = 20
OLDEST = 5
WINDOW_S = 300.0
OUTCOME_EVENTS = 20  # the trainer's last this-many "groups" events (within WINDOW_S) are the recent outcomes
SCAN = 20_000  # rare event kinds are looked for among the run's last SCAN events
WARNING_KINDS = ("weights_refused", "weights_failing", "publish_failing", "wait_deadline")
PROBE_TIMEOUT_S = 3.0


def _recent(s, run_id: str, top: int, kinds: tuple[str, ...], limit: int, since: float | None = None,
            service: str | None = None) -> list[EventRow]:
    """The newest `limit` events of `kinds` among the run's events with ids above top - SCAN."""
    q = select(EventRow).where(EventRow.run_id == run_id, EventRow.id > top - SCAN, EventRow.kind.in_(kinds))
    if since is not None:
        q = q.where(EventRow.time >= since)
    if service is not None:
        q = q.where(EventRow.service == service)
    return list(s.scalars(q.order_by(EventRow.id.desc()).limit(limit)))


def _len(v) -> int:
    return len(v) if isinstance(v, list) else 0


def from_database(Session_, run_id: str) -> dict:
    """Everything the database knows (raises LookupError via store.get_run for an unknown run)."""
    now = time.time()
    with Session_() as s:
        r = store.get_run(s, run_id)
        cfg = r.config or {}
        sched = cfg.get("schedule", {}) or {}
        ms, bs = sched.get("max_staleness", 4), sched.get("batch_size", 8)
        _, bound = ledger.run_bound(s, run_id, cfg, r.current_version)
        prog = completion.progress(s, run_id)
        top = s.scalar(select(func.max(EventRow.id)).where(EventRow.run_id == run_id)) or 0
        health = [{"service": h.service, "instance": h.instance, "last_seen": h.last_seen, "data": h.data or {}}
                  for h in s.scalars(select(Health).where(Health.run_id == run_id))]
        steps = [{"time": e.time, "step": e.data.get("step"), "version": e.data.get("version"),
                  "wall_s": e.data.get("wall_s")} for e in _recent(s, run_id, top, ("step",), STEPS, service="trainer")][::-1]
        started = _recent(s, run_id, top, ("started", "resumed"), 1, service="trainer")
        published = _recent(s, run_id, top, ("published",), 1)
        guard = _recent(s, run_id, top, ("guard_tripped",), 1, service="trainer")
        outcomes = Counter()
        for e in _recent(s, run_id, top, ("groups",), OUTCOME_EVENTS, since=now - WINDOW_S, service="trainer"):
            for k in ("trained", "dropped_stale", "filtered"):
                outcomes[k] += _len(e.data.get(k))
        letters = _recent(s, run_id, top, ("dead_letter",), 1000, since=now - WINDOW_S)
        reasons = Counter(str(e.data.get("reason") or "?")[:300] for e in letters).most_common(5)
        warnings = [{"service": e.service, "kind": e.kind, "time": e.time, "data": e.data}
                    for e in _recent(s, run_id, top, WARNING_KINDS, 20, since=now - WINDOW_S)]
        oldest = [{"group_id": g.group_id, "state": g.state, "since": g.updated_at}
                  for g in s.scalars(select(Ledger).where(Ledger.run_id == run_id, Ledger.state.in_((RELEASED, RECEIVED)))
                                     .order_by(Ledger.updated_at).limit(OLDEST))]
        seen_at = s.scalar(select(WeightVersionRow.seen_at).where(WeightVersionRow.run_id == run_id,
                                                                   WeightVersionRow.version == r.current_version))
        signal = no_signal.state(s, run_id)
    return {
        "now": now,
        "run": {"id": run_id, "status": r.status, "current_version": r.current_version,
                "batch_size": bs, "max_staleness": ms,
                "events_interval_s": (cfg.get("telemetry") or {}).get("events_interval_s", 5.0),
                "reward_task": (cfg.get("reward") or {}).get("task"),
                "online": any(h["data"].get("online") for h in health if h["service"] == "rollout")},
        "progress": prog,
        "admission": {"bound": bound, "outstanding": prog["ledger"]["outstanding"]},
        "health": health, "steps": steps,
        "trainer_started": started[0].time if started else None,
        "current_version_since": seen_at,
        "last_published": published[0].time if published else None,
        "outcomes": dict(outcomes), "oldest_in_flight": oldest,
        "dead_letters": {"recent": len(letters), "window_s": WINDOW_S, "reasons": [list(x) for x in reasons]},
        "warnings": warnings, "signal": signal,
        "guard": dict(guard[0].data, time=guard[0].time) if guard else None,
    }


async def _store_probe(ctl, run_id: str) -> dict:
    url = ctl.cfg.weights.url
    try:
        await asyncio.wait_for(ctl.weight_store().versions(run_id), PROBE_TIMEOUT_S)
        return {"ok": True, "url": url}
    except asyncio.TimeoutError:
        return {"ok": False, "url": url, "error": f"no answer within {PROBE_TIMEOUT_S:g} s"}
    except Exception as exc:
        return {"ok": False, "url": url, "error": f"{type(exc).__name__}: {exc}"[:500]}


async def _nats_probe(ctl) -> dict:
    if not ctl.ready:
        return {"error": f"NATS {ctl.nats_state}"}
    try:
        info = await asyncio.wait_for(ctl.js.account_info(), PROBE_TIMEOUT_S)
        return {"storage": info.storage, "storage_max": info.limits.max_storage if info.limits else -1}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


async def gather(ctl, run_id: str) -> dict:
    """The whole snapshot: the database part in a thread, the bus and store probes concurrently."""
    db, queues, store_state, nats_state = await asyncio.gather(
        asyncio.to_thread(from_database, ctl.Session, run_id), ctl.queue_depths(run_id),
        _store_probe(ctl, run_id), _nats_probe(ctl))
    db.update(queues=queues, store=store_state, nats=nats_state,
              limits={"alive_s": ctl.ccfg.diagnosis_alive_s, "stall_s": ctl.ccfg.diagnosis_stall_s})
    return db
