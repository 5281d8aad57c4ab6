"""Observability overhead: the demo's trainer steps/s with every observability path on against all off.

    python -m bench.tracking [--steps 60] [--warmup 5] [--rounds 3]

Pairs of runs of `jetrl demo`'s workload (maxdigit, tiny model, local engine, real training) through `jetrl up`'s
launcher, one after the other, the same seed:

- off: every process's Prometheus endpoint off (`telemetry.metrics_port: -1`), no tracker, nobody reading.
- on: metrics endpoints on, `jetrl track --to tensorboard` subscribed to the run, and a reader standing
  for an open dashboard (its JSON reads every 2 s, a rollout-viewer page every 10 s) and a Prometheus
  server scraping every /metrics endpoint every 16 s.

The figure is the trainer's steps/s between the `--warmup`th and the last step event (its `time`).
`--rounds` pairs (off, on, off, on, ...) in one run. Each run also prints the CPU seconds every process used
(each service, the tracker, NATS, and this process, which hosts the controller's HTTP client and the
reader), so where an "on" run's time goes shows beside its rate.
Last line: `observability_overhead_ratio: X` = median steps/s on ÷ median steps/s off (target >= 0.95).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.cpu import cpu_seconds
from launcher.demo.run import demo_settings
from launcher.demo.task import write_dataset
from launcher.plan import UpOptions
from launcher.up import Launcher, poll_until
from shared.config import JetrlConfig


async def reader(launcher: Launcher, stop: asyncio.Event) -> int:
    """What an open dashboard does (controller/dashboard/app.js: its reads every 2 s; a viewer page, which
    it loads on demand, every 10 s here) and a Prometheus scrape every 15 s of every /metrics endpoint;
    returns the requests made."""
    n, tick = 0, 0
    run = launcher.run
    scrape = [f"http://127.0.0.1:{p}/metrics" for p in launcher.metrics_ports.values()]
    async with httpx.AsyncClient(timeout=10) as plain:
        while not stop.is_set():
            paths = ["/v1/health", "/v1/runs", f"/v1/runs/{run}/metrics", f"/v1/runs/{run}/staleness",
                     f"/v1/runs/{run}/queues", f"/v1/runs/{run}/timings?last=500"]
            if tick % 5 == 0:
                paths.append(f"/v1/runs/{run}/rollouts?limit=10")
            for path in paths + (["/metrics"] if tick % 8 == 0 else []):
                with contextlib.suppress(httpx.HTTPError):
                    await launcher.http.get(path)
                    n += 1
            for u in scrape if tick % 8 == 0 else []:
                with contextlib.suppress(httpx.HTTPError):
                    await plain.get(u)
                    n += 1
            tick += 1
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 2.0)
    return n


def process_cpu(launcher: Launcher) -> dict[str, float]:
    """CPU seconds so far of every supervised process, plus this one ('bench')."""
    out = {name: cpu_seconds(c.proc.pid) for name, c in launcher.sup.children.items() if c.proc}
    out["bench"] = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    return out


async def timed_run(observe: bool, steps: int, warmup: int, root: Path, dataset: Path) -> tuple[float, int]:
    s = demo_settings(run=f"obs-{'on' if observe else 'off'}", steps=steps)
    if observe:
        s["tracking"] = {"enabled": True, "to": "tensorboard"}
        s["telemetry"]["metrics_base_port"] = 0
    else:
        s["telemetry"]["metrics_port"] = -1
    cfg = JetrlConfig.model_validate(s)
    launcher = Launcher(cfg, UpOptions(run_dir=root / cfg.run, workers=1, echo_logs=False, with_eval=False))
    stop, reads = asyncio.Event(), None
    try:
        await launcher.start(timeout_s=300)
        await launcher.enqueue(dataset, epochs=1, shuffle_seed=0)
        if observe:
            reads = asyncio.create_task(reader(launcher, stop))

        async def finished():
            await launcher.poll()
            return launcher.sup.status()["trainer"]["finished"]

        await poll_until(finished, 1800, "the trainer to finish")
        await launcher.poll()
        cpu = process_cpu(launcher)
        print(f"  {'on ' if observe else 'off'} CPU seconds by process: "
              + ", ".join(f"{k} {v:.1f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])), flush=True)
    finally:
        stop.set()
        n_reads = await reads if reads is not None else 0
        await launcher.stop()
    times = [st["time"] for st in launcher.steps if st["step"] >= warmup]
    rate = (len(times) - 1) / (times[-1] - times[0])
    if observe:
        events = list((root / cfg.run / "tracking" / cfg.run).glob("events.out.tfevents.*"))
        assert events and events[0].stat().st_size > 0, "the tracker wrote no event file"
    return rate, n_reads


async def main_async(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="jetrl-bench-tracking-") as tmp:
        root = Path(tmp)
        train, _ = write_dataset(root / "data", train=max(4000, a.steps * 16 * 2), heldout=10, seed=0)
        t0 = time.monotonic()
        offs, ons = [], []
        for r in range(a.rounds):  # off, on, off, on, ...: slow drifts of the machine hit both sides alike
            off, _ = await timed_run(False, a.steps, a.warmup, root / f"r{r}", train)
            print(f"round {r + 1} off: {off:.3f} trainer steps/s (steps {a.warmup}..{a.steps})", flush=True)
            on, reads = await timed_run(True, a.steps, a.warmup, root / f"r{r}", train)
            print(f"round {r + 1} on:  {on:.3f} trainer steps/s (tracker to tensorboard, metrics endpoints, "
                  f"{reads} dashboard/scrape requests); ratio {on / off:.3f}", flush=True)
            offs.append(off)
            ons.append(on)
        print(f"wall time {time.monotonic() - t0:.0f} s", flush=True)
        print(f"median off {statistics.median(offs):.3f}, on {statistics.median(ons):.3f} steps/s over "
              f"{a.rounds} round(s); per-round ratios "
              + ", ".join(f"{n / f:.3f}" for f, n in zip(offs, ons, strict=True)))
        print(f"observability_overhead_ratio: {statistics.median(ons) / statistics.median(offs):.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="Optimizer steps per run.")
    p.add_argument("--warmup", type=int, default=5, help="Steps left out of the rate (start-up, first loads).")
    p.add_argument("--rounds", type=int, default=3, help="Off/on pairs, alternated; the ratio is of the medians "
                   "(one pair swung from 0.82 to 0.98 between runs on the 2-core machine).")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
