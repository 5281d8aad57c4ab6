"""The live status panel of `jetrl up` / `jetrl demo`: one rich renderable from a Launcher snapshot.

Fed by the controller's JSON API (run, ledger, queues, service health, trainer step and eval events)
and the supervisor (each child's pid, restarts, last exit code).
"""

from __future__ import annotations

import time

from rich.console import Group
from rich.panel import Panel
from rich.table import Table

from shared import __version__


def samples_per_s(steps: list[dict], window_s: float = 30.0) -> float:
    """Trained samples per second over the trainer steps of the last `window_s` seconds."""
    if len(steps) < 2:
        return 0.0
    t_end = steps[-1]["time"]
    recent = [s for s in steps if s["time"] >= t_end - window_s]
    if len(recent) < 2:
        recent = steps[-2:]
    dt = recent[-1]["time"] - recent[0]["time"]
    return sum(float(s.get("samples", 0)) for s in recent[1:]) / dt if dt > 0 else 0.0


def mean_staleness(hist: dict) -> float:
    n = sum(int(v) for v in hist.values())
    return sum(int(k) * int(v) for k, v in hist.items()) / n if n else 0.0


def _fmt(v, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def render(cfg, snap: dict):
    run = snap.get("run") or {}
    lg = run.get("ledger") or {}
    steps, evals = snap.get("steps") or [], snap.get("evals") or []
    last = steps[-1] if steps else {}
    ev = evals[-1] if evals else {}
    top = Table.grid(padding=(0, 3))
    top.add_row(
        f"[bold]run[/] {cfg.run} ({run.get('status', '?')})",
        f"[bold]version[/] {run.get('current_version', '-')}"
        + (f" (step {last.get('step', '-')}/{cfg.schedule.total_steps})" if cfg.schedule.total_steps else ""),
        f"[bold]reward[/] {_fmt(last.get('reward_mean'))}",
        f"[bold]held-out[/] {_fmt(ev.get('reward'))}" + (f" (v{ev['version']})" if ev else ""),
    )
    top.add_row(
        f"[bold]staleness[/] mean {mean_staleness(last.get('staleness_hist') or {}):.2f} "
        f"(max {cfg.schedule.max_staleness})",
        f"[bold]samples/s[/] {samples_per_s(steps):.1f}",
        f"[bold]dropped stale[/] {lg.get('dropped_stale', 0)}",
        f"[bold]bound[/] {run.get('admission_bound', '-')}",
    )
    q = snap.get("queues") or {}
    prompts, traj = q.get("prompts") or {}, q.get("trajectories") or {}
    top.add_row(
        f"[bold]prompts[/] waiting {prompts.get('pending', '-')} / in work {prompts.get('ack_pending', '-')}",
        f"[bold]trajectories[/] waiting {traj.get('pending', '-')}",
        f"[bold]released[/] {lg.get('released', 0)} trained {lg.get('trained', 0)}",
        f"[bold]dead letters[/] {q.get('dead_letters_in_stream', '-')}",
    )
    services = Table(box=None, padding=(0, 2), header_style="bold")
    for col in ("service", "pid", "state", "restarts", "last exit", "health"):
        services.add_column(col)
    health = {}
    for s in (snap.get("health") or {}).get("services", []):
        if s.get("run") == cfg.run:
            health.setdefault(s["service"], []).append(s)
    for name, st in (snap.get("children") or {}).items():
        kind = name.split("-")[0]
        hs = health.get(kind, [])
        h = ", ".join(f"{x['status'] if x['alive'] else 'silent'} {x['age_s']:.0f}s" for x in hs) or "-"
        state = "[green]running[/]" if st["running"] else ("finished" if st["finished"] else "[red]down[/]")
        services.add_row(name, str(st["pid"] or "-"), state, str(st["restarts"]),
                         "-" if st["last_exit"] is None else str(st["last_exit"]), h)
    parts = [top, services]
    if snap.get("error"):
        parts.append(f"[yellow]controller: {snap['error']}[/]")
    age = time.time() - snap.get("time", time.time())
    return Panel(Group(*parts), title=f"jetrl {__version__}", subtitle=f"updated {age:.0f}s ago", expand=True)
