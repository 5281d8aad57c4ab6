"""Why a run is not advancing, in plain words: rules over the evidence controller/evidence.py gathers.

`diagnose(ev)` is a pure function of one evidence snapshot (a dict: the ledger, the services' health
reports, recent events, queue depths, a probe of the weight store and of NATS; evidence.py documents each
field) and returns

    {"state": "advancing" | "starting" | "stalled" | "complete" | "paused" | "no data",
     "summary": one line, "findings": [{"cause", "severity", "summary", "evidence", "action"}, ...]}

Severity "error" is a cause that stops the run; "warning" one that wastes work while the run advances (dead
letters, samples dropped as stale, groups without a reward spread). A healthy run has no findings. The
causes, each recognised on its own evidence (docs/controller.md, "Why is my run not advancing"):

| cause | evidence |
| --- | --- |
| complete | every enqueued prompt released and decided (completion.py) |
| no_data | nothing enqueued |
| paused / stopped | the run's status |
| nats_unreachable | the controller cannot read the queues |
| disk_full | a service reports "no space left", or NATS "insufficient resources" |
| trainer_dead | no trainer health report for `alive_s` (never: "no trainer has reported") |
| trainer_stuck | the trainer reports, but no step for `stall_s` in a phase other than waiting for groups |
| no_rollout_worker | no rollout health report for `alive_s` |
| weight_store_down | the weight store does not answer the controller |
| workers_behind | workers alive, none within max_staleness of the announced version (why: their fetch errors, refused versions) |
| reward_unavailable | no reward replica reports, or workers' last errors are reward timeouts / no responders |
| admission_full | outstanding groups at the admission bound, the oldest in flight for `stall_s` (which, where, since when) |
| all_stale | recent groups all dropped as stale (max_staleness too small for the rollout speed) |
| dead_letters | groups dead-lettered in the last `window_s` (top reasons) |
| no_signal | the trainer's recent groups had no reward spread (no_signal.py) |
| collapse_guard | the trainer's collapse guard tripped in the last GUARD_RECENT_S (trainer.guard; a pause by it is named in "paused") |

Thresholds: `alive_s` = max(controller.diagnosis_alive_s (15 s), 3 x telemetry.events_interval_s); `stall_s`
= max(controller.diagnosis_stall_s (30 s), 2 x the median trainer step wall time): the time within which a
fault is named (bench/diagnosis.py measures it).
"""

from __future__ import annotations

import statistics

from shared.runtime.waits import WAITING_FOR_WORK

STALL_STEPS = 2.0
GUARD_RECENT_S = 600.0  # a guard trip is listed this long after it  # a step missing for this many median step times is a stall
DISK_WORDS = ("no space left", "enospc", "insufficient resources", "disk full", "quota exceeded")
REWARD_WORDS = ("reward", "no responders", "noresponders")


def _finding(cause: str, severity: str, summary: str, action: str, **evidence) -> dict:
    return {"cause": cause, "severity": severity, "summary": summary, "action": action, "evidence": evidence}


def _ago(now: float, t: float | None) -> str:
    if t is None:
        return "never"
    s = max(0.0, now - t)
    return f"{s:.0f} s ago" if s < 120 else f"{s / 60:.1f} min ago"


def thresholds(ev: dict) -> tuple[float, float]:
    """(alive_s, stall_s) of this run (see the module docstring); the floors are the controller's
    diagnosis_alive_s / diagnosis_stall_s, carried in the evidence as `limits`."""
    limits = ev.get("limits") or {}
    alive = max(limits.get("alive_s", 15.0), 3.0 * float(ev["run"].get("events_interval_s") or 5.0))
    walls = [s["wall_s"] for s in ev.get("steps", []) if isinstance(s.get("wall_s"), (int, float))]
    median = statistics.median(walls) if walls else 0.0
    return alive, max(limits.get("stall_s", 30.0), STALL_STEPS * median)


def _alive(ev: dict, service: str, alive_s: float) -> list[dict]:
    return [h for h in ev.get("health", []) if h["service"] == service and ev["now"] - h["last_seen"] <= alive_s]


def _last_seen(ev: dict, service: str) -> float | None:
    seen = [h["last_seen"] for h in ev.get("health", []) if h["service"] == service]
    return max(seen) if seen else None


def _texts(ev: dict) -> list[tuple[str, str]]:
    """(where, error text) of every error the services report now: health data fields and recent warning events."""
    out = []
    for h in ev.get("health", []):
        for key in ("publish_error", "fetch_error", "last_error"):
            v = (h.get("data") or {}).get(key)
            if isinstance(v, str) and v:
                out.append((f"{h['service']} {h['instance']} ({key})", v))
    for w in ev.get("warnings", []):
        v = w.get("data", {}).get("error")
        if isinstance(v, str) and v:
            out.append((f"{w['service']} {w['kind']}", v))
    for k in ("error",):
        v = (ev.get("store") or {}).get(k)
        if isinstance(v, str) and v:
            out.append(("weight store", v))
    return out


def _disk_full(ev: dict) -> dict | None:
    hits = [(w, t) for w, t in _texts(ev) if any(x in t.lower() for x in DISK_WORDS)]
    nats = ev.get("nats") or {}
    if nats.get("storage_max") and nats["storage_max"] > 0 and nats.get("storage", 0) >= 0.98 * nats["storage_max"]:
        hits.append(("nats", f"JetStream storage {nats['storage']} of {nats['storage_max']} bytes"))
    if not hits:
        return None
    return _finding("disk_full", "error", f"a disk is full: {hits[0][0]}: {hits[0][1][:200]}",
                    "free space on that host (old checkpoints, weight versions: weights.keep_versions; NATS "
                    "store_dir), or give it a larger volume; the services retry and go on by themselves",
                    reports=[{"where": w, "error": t[:300]} for w, t in hits[:5]])


def _trainer(ev: dict, alive_s: float, stall_s: float) -> dict | None:
    now = ev["now"]
    alive = _alive(ev, "trainer", alive_s)
    if not alive:
        seen = _last_seen(ev, "trainer")
        if seen is None:
            return _finding("trainer_dead", "error", "no trainer has reported for this run",
                            "start the trainer (`jetrl trainer -c run.yaml`); `jetrl up` restarts it by itself")
        return _finding("trainer_dead", "error", f"the trainer stopped reporting {_ago(now, seen)} (dead, or "
                        "frozen: a SIGSTOPped or swapping process sends no health)",
                        "look at the trainer's log; restart it with --resume (it continues from its last checkpoint)",
                        last_seen=seen)
    h = max(alive, key=lambda x: x["last_seen"])
    data = h.get("data") or {}
    phase, since = data.get("phase"), data.get("phase_since")
    last_step = ev["steps"][-1]["time"] if ev.get("steps") else None
    ref = max(x for x in (last_step, ev.get("trainer_started")) if x is not None) \
        if (last_step or ev.get("trainer_started")) else None
    if phase and phase != WAITING_FOR_WORK and isinstance(since, (int, float)) and now - since > stall_s \
            and (ref is None or now - ref > stall_s):
        return _finding("trainer_stuck", "error", f"the trainer has been in phase '{phase}' since "
                        f"{_ago(now, since)} without a step (its median step takes {stall_s / STALL_STEPS:.0f} s or less)",
                        "look at the trainer's log for that phase (publishing: the weight store; checkpointing: "
                        "its disk); a restart with --resume continues from the last checkpoint",
                        phase=phase, phase_since=since, instance=h["instance"], error=data.get("publish_error"))
    return None


def _workers(ev: dict, alive_s: float, stall_s: float) -> list[dict]:
    now, run = ev["now"], ev["run"]
    out = []
    alive = _alive(ev, "rollout", alive_s)
    store = ev.get("store") or {}
    if store.get("ok") is False:
        out.append(_finding("weight_store_down", "error", f"the weight store does not answer: {store.get('error')}",
                            "start the weight store (`jetrl weights serve`) or fix weights.url; the trainer retries "
                            "its publish and the workers their fetch", url=store.get("url")))
    if not alive:
        if run.get("online"):
            return out
        seen = _last_seen(ev, "rollout")
        out.append(_finding("no_rollout_worker", "error",
                            "no rollout worker has reported for this run" if seen is None else
                            f"no rollout worker alive: the last report was {_ago(now, seen)}",
                            "start workers (`jetrl rollout -c run.yaml`); `jetrl up` restarts them by itself",
                            last_seen=seen))
        return out
    current, ms = run.get("current_version", -1), run.get("max_staleness", 0)
    if current > 0:
        versions = {h["instance"]: (h.get("data") or {}).get("version") for h in alive}
        usable = [v for v in versions.values() if isinstance(v, int) and current - v <= ms]
        announced_since = ev.get("current_version_since")
        if not usable and (announced_since is None or now - announced_since > stall_s):
            errors = {h["instance"]: (h.get("data") or {}).get("fetch_error") for h in alive
                      if (h.get("data") or {}).get("fetch_error")}
            refused = [w for w in ev.get("warnings", []) if w["kind"] == "weights_refused"]
            why = ("their weight fetch fails: " + next(iter(errors.values()))[:200]) if errors else \
                ("they refused version(s) " + ", ".join(str(w["data"].get("version")) for w in refused[:5])
                 + ": " + str(refused[0]["data"].get("error"))[:200]) if refused else \
                ("the weight store does not answer" if store.get("ok") is False else "they have not fetched it yet")
            out.append(_finding("workers_behind", "error",
                                f"version {current} is announced but no worker is within max_staleness {ms} of it "
                                f"(workers on {sorted(set(map(str, versions.values())))}): {why}",
                                "check the weight store and the workers' logs; a refused version means the "
                                "store does not hold what was announced, or a LoRA adapter on another base",
                                worker_versions=versions, fetch_errors=errors,
                                refused=[w["data"] for w in refused[:5]]))
    return out


def _reward(ev: dict, alive_s: float) -> dict | None:
    run = ev["run"]
    errors = [(h["instance"], (h.get("data") or {}).get("last_error"), (h.get("data") or {}).get("last_error_at"))
              for h in _alive(ev, "rollout", alive_s)]
    recent = [(i, e) for i, e, t in errors if isinstance(e, str) and any(w in e.lower() for w in REWARD_WORDS)
              and isinstance(t, (int, float)) and ev["now"] - t <= max(60.0, 4 * alive_s)]
    replicas = _alive(ev, "reward", alive_s)
    task = run.get("reward_task")
    if not replicas:
        seen = _last_seen(ev, "reward")
        return _finding("reward_unavailable", "error",
                        f"no reward replica for task {task!r} is alive (last report {_ago(ev['now'], seen)})"
                        + (f"; workers report: {recent[0][1][:200]}" if recent else ""),
                        "start one (`jetrl reward serve --task ...`); groups are retried, then dead-lettered",
                        task=task, worker_errors=recent[:5])
    if recent:
        return _finding("reward_unavailable", "error",
                        f"{len(replicas)} reward replica(s) alive but workers' scoring fails: {recent[0][1][:200]}",
                        "the reward service is backlogged or stuck: add replicas, or raise reward.timeout_s",
                        task=task, replicas=[h["instance"] for h in replicas], worker_errors=recent[:5])
    return None


def _admission(ev: dict, stall_s: float) -> dict | None:
    adm = ev.get("admission") or {}
    oldest = ev.get("oldest_in_flight") or []
    if not oldest or adm.get("outstanding", 0) < adm.get("bound", 1) or ev["now"] - oldest[0]["since"] <= stall_s:
        return None
    where = {"released": "with the rollout workers (no trajectory yet)", "received": "at the trainer (not trained yet)"}
    g = oldest[0]
    return _finding("admission_full", "error",
                    f"the admission bound ({adm['bound']} groups) is reached and nothing is freed: the oldest group "
                    f"in flight, {g['group_id']}, has been {where.get(g['state'], g['state'])} since "
                    f"{_ago(ev['now'], g['since'])}",
                    "see the other causes listed; groups a dead worker held come back after its ack wait "
                    "(rollout.ack_wait_s)", bound=adm.get("bound"), outstanding=adm.get("outstanding"), oldest=oldest)


def _stale(ev: dict) -> dict | None:
    o = ev.get("outcomes") or {}
    decided = o.get("trained", 0) + o.get("dropped_stale", 0)
    if not o.get("dropped_stale") or decided < max(1, ev["run"].get("batch_size", 1)):
        return None
    share = o["dropped_stale"] / decided
    if share < 0.5:
        return None
    return _finding("all_stale", "error" if o.get("trained", 0) == 0 else "warning",
                    f"{share:.0%} of the last {decided} groups were dropped as stale (schedule.max_staleness "
                    f"{ev['run'].get('max_staleness')}): generation is slower than training",
                    "raise schedule.max_staleness, add rollout workers, or lower rollout.max_in_flight",
                    **o)


def _dead_letters(ev: dict) -> dict | None:
    d = ev.get("dead_letters") or {}
    if not d.get("recent"):
        return None
    top = d.get("reasons") or []
    return _finding("dead_letters", "warning",
                    f"{d['recent']} group(s) dead-lettered in the last {d.get('window_s', 0) / 60:.0f} min"
                    + (f"; most often: {top[0][0][:200]} ({top[0][1]}x)" if top else ""),
                    "`jetrl dlq` lists them with their reasons; fix the cause, then replay them",
                    recent=d["recent"], reasons=top[:5])


def _signal(ev: dict) -> dict | None:
    sig = ev.get("signal") or {}
    if not sig.get("no_signal"):
        return None
    return _finding("no_signal", "warning", sig.get("message") or "recent groups had no reward spread",
                    "see docs/algorithms.md, sparse rewards: rollout.adaptive, launch.sampling learnable-first",
                    since_step=sig.get("since_step"), groups=sig.get("groups"))


def _guard(ev: dict) -> dict | None:
    g = ev.get("guard")
    if not g or ev["now"] - g.get("time", 0) > GUARD_RECENT_S:
        return None
    done = (f"rolled back to step {g.get('to_step')} (weights of version {g.get('weights_of_version')}, now version "
            f"{g.get('new_version')}), {g.get('discarded_groups')} trained groups discarded, learning rate x "
            f"{g.get('lr_factor')}") if g.get("action") == "rollback" else "warned only (trainer.guard.action warn)"
    return _finding("collapse_guard", "warning", f"the collapse guard tripped at step {g.get('step')} "
                    f"({', '.join(g.get('reasons') or [])} failing since step {g.get('since_step')}): {done}",
                    "look at entropy, clip and capped fractions and gradient norm per step (dashboard, trackers); "
                    "a lower trainer.optim.lr or schedule.max_staleness", guard_action=g.get("action"),
                    **{k: g.get(k) for k in ("step", "since_step", "reasons", "evidence")})


def diagnose(ev: dict) -> dict:
    now, run = ev["now"], ev["run"]
    prog = ev["progress"]
    alive_s, stall_s = thresholds(ev)
    if prog["state"] == "complete":
        led = prog["ledger"]
        f = _finding("complete", "info", f"the run is complete: all {prog['enqueued']} enqueued prompts are decided "
                     f"({led['trained']} trained, {led['dropped_stale']} dropped as stale, {led['filtered']} filtered, "
                     f"{led['dead_lettered']} dead-lettered)", "enqueue more data to continue it", **led)
        return {"state": "complete", "summary": f["summary"], "findings": [f]}
    guard = ev.get("guard")
    if run.get("status") in ("paused", "stopped"):
        by_guard = run["status"] == "paused" and guard is not None and guard.get("action") == "pause"
        f = _finding(run["status"], "info", f"the run is {run['status']}" + (
                     f" by the collapse guard at step {guard.get('step')}: {', '.join(guard.get('reasons') or [])}"
                     + (f" ({guard['why']})" if guard.get("why") else "") if by_guard else ""),
                     ("look at the step statistics the guard names (the dashboard's charts), then resume it (POST "
                      "/v1/runs/{run}/resume), maybe with a lower learning rate" if by_guard else
                      "resume it (POST /v1/runs/{run}/resume)") if run["status"] == "paused" else "create a new run",
                     **({"guard": guard} if by_guard else {}))
        return {"state": "paused", "summary": f["summary"], "findings": [f]}
    if prog["state"] == "no data" and not run.get("online"):
        f = _finding("no_data", "info", "nothing is enqueued: the run has no prompts to release",
                     "enqueue a dataset (`jetrl enqueue RUN DATASET` or POST /v1/runs/{run}/enqueues)")
        return {"state": "no data", "summary": f["summary"], "findings": [f]}
    findings: list[dict] = []
    q = ev.get("queues") or {}
    if q.get("nats") not in (None, "connected"):
        findings.append(_finding("nats_unreachable", "error", f"the controller's NATS connection is {q['nats']}",
                                 "check the NATS server (`nats.url`); every service reconnects by itself"))
    for f in (_disk_full(ev), _trainer(ev, alive_s, stall_s)):
        if f is not None:
            findings.append(f)
    findings += _workers(ev, alive_s, stall_s)
    for f in (_reward(ev, alive_s), _admission(ev, stall_s), _stale(ev), _dead_letters(ev), _signal(ev),
              _guard(ev)):
        if f is not None:
            findings.append(f)
    last_step = ev["steps"][-1]["time"] if ev.get("steps") else None
    started, published = ev.get("trainer_started"), ev.get("last_published")
    errors = [f for f in findings if f["severity"] == "error"]
    generating = [h for h in _alive(ev, "rollout", alive_s) if (h.get("data") or {}).get("in_flight")]
    if not errors and last_step is not None and now - last_step <= stall_s:
        state = "advancing"
        summary = f"advancing: version {run.get('current_version')}, last step {_ago(now, last_step)}"
    elif not errors and ((published is not None and now - published <= stall_s) or generating):
        state = "advancing"
        summary = (f"advancing: generating ({len(generating)} worker(s) busy, last group published "
                   f"{_ago(now, published)}); last trainer step {_ago(now, last_step)}")
    elif not errors and last_step is None and (started is None or now - started <= stall_s):
        state = "starting"
        summary = "starting: no trainer step yet"
    else:
        state = "stalled"
        summary = (f"stalled: no trainer step for {_ago(now, last_step).removesuffix(' ago')}" if last_step
                   else "stalled: no trainer step yet") + (f": {errors[0]['summary']}" if errors else "")
        if not errors:
            findings.append(_finding("unknown", "error", "no step and no generation for a while, and none of the "
                                     "known causes applies", "look at the services' logs (`jetrl up` writes them "
                                     "under the run dir)", stall_s=stall_s))
    if prog["state"] == "draining":
        summary += f" (every prompt is released; {prog['ledger']['in_flight']} group(s) still in flight)"
    return {"state": state, "summary": summary, "findings": findings, "alive_s": alive_s, "stall_s": stall_s}
