"""Prometheus metrics of the trainer (default registry, served by shared.runtime.telemetry.start_metrics),
and what the service loop records in them after a step (`record_step`, `record_stages`) or a drop
(`record_outcomes`)."""

from __future__ import annotations

import os
import resource

from prometheus_client import Counter, Gauge, Histogram

from shared.contract.messages import JUDGE_METRIC_PREFIXES

VERSION = Gauge("jetrl_trainer_version", "Policy version the trainer is at (last published).")
STEPS = Counter("jetrl_trainer_steps_total", "Optimizer steps taken.")
GROUPS = Counter("jetrl_trainer_groups_total", "Trajectory groups by outcome.", ["outcome"])
DROPPED_STALE_SAMPLES = Counter("jetrl_trainer_dropped_stale_samples_total",
                                "Samples dropped because staleness > schedule.max_staleness.")
SAMPLES = Counter("jetrl_trainer_samples_total", "Samples trained.")
TOKENS = Counter("jetrl_trainer_tokens_total", "Tokens processed by training steps.")
STALENESS = Histogram("jetrl_trainer_sample_staleness", "Staleness of trained samples (versions).",
                      buckets=(0, 1, 2, 3, 4, 6, 8, 16, 32))
LOSS = Gauge("jetrl_trainer_loss", "Loss of the last step.")
REWARD = Gauge("jetrl_trainer_reward_mean", "Mean reward of the samples of the last step.")
TOKENS_PER_S = Gauge("jetrl_trainer_tokens_per_s", "Training throughput of the last step.")
STEP_TIME = Gauge("jetrl_trainer_step_time_s", "Wall time of the last optimizer step.")
CLIP_FRAC = Gauge("jetrl_trainer_clip_frac", "Fraction of loss tokens where the PPO clip was active.")
BEHAV_WEIGHT = Gauge("jetrl_trainer_behav_weight_mean", "Mean decoupled importance weight pi_prox/pi_behav.")
CAPPED_FRAC = Gauge("jetrl_trainer_capped_frac", "Fraction of loss tokens above behav_imp_weight_cap.")
ADV_ABS = Gauge("jetrl_trainer_adv_abs_mean", "Mean |advantage| over loss tokens.")
STAGE_SECONDS = Histogram("jetrl_trainer_stage_seconds", "Seconds per step in each stage (trainer_service/timings.py).",
                          ["stage"], buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
QUEUE_WAIT = Histogram("jetrl_trainer_queue_wait_seconds",
                       "Mean time a step's groups waited in the TRAJECTORIES stream (created_at -> batch).",
                       buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800))


def memory_gb() -> dict[str, float]:
    """This process's resident set now and its peak (VmHWM), in GB, for the step event: a trainer whose
    memory grows over steps shows it here (Linux; 0.0 where /proc is absent)."""
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        rss = 0
    # KiB on Linux; the kernel updates this high-water mark lazily, so it can trail the current RSS
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, rss)
    return {"rss_gb": round(rss / 1e9, 3), "peak_rss_gb": round(peak / 1e9, 3)}


def record_stages(stages: dict[str, float], queue_wait: float) -> None:
    """A step's stage seconds (trainer_service/timings.py) and its groups' mean queue wait."""
    for k, v in stages.items():
        STAGE_SECONDS.labels(k).observe(v)
    QUEUE_WAIT.observe(queue_wait)


def record_outcomes(dropped_stale: list, filtered: list, dropped_stale_samples: int) -> None:
    """Groups dropped as stale or filtered, and the stale samples dropped."""
    GROUPS.labels("dropped_stale").inc(len(dropped_stale))
    GROUPS.labels("filtered").inc(len(filtered))
    DROPPED_STALE_SAMPLES.inc(dropped_stale_samples)


def record_step(stats: dict, batch, samples: int, reward_mean: float) -> None:
    """The counters and gauges of one trained step: `stats` from the step, `batch` the intake's Batch it
    trained, `samples` the items trained."""
    GROUPS.labels("trained").inc(len(batch.groups))
    record_outcomes(batch.dropped_stale, batch.filtered, batch.dropped_stale_samples)
    SAMPLES.inc(samples)
    TOKENS.inc(stats["tokens"])
    for k, v in batch.staleness_hist.items():
        for _ in range(v):
            STALENESS.observe(k)
    LOSS.set(stats["loss"])
    REWARD.set(reward_mean)
    TOKENS_PER_S.set(stats["tokens_per_s"])
    STEP_TIME.set(stats["step_time_s"])
    CLIP_FRAC.set(stats["clip_frac"])
    BEHAV_WEIGHT.set(stats["behav_weight_mean"])
    CAPPED_FRAC.set(stats["capped_frac"])
    ADV_ABS.set(stats["adv_abs_mean"])


def judge_metric_means(samples) -> dict[str, float]:
    """Mean over `samples` of each numeric judge metric (`reward_criterion/<name>`, `reward_pairwise/...`, from
    the reward service's per-completion metrics), for the step event: the dashboard and trackers plot them."""
    acc: dict[str, list[float]] = {}
    for s in samples:
        for k, v in (s.metrics or {}).items():
            if k.startswith(JUDGE_METRIC_PREFIXES) and isinstance(v, (int, float)) and not isinstance(v, bool):
                acc.setdefault(k, []).append(float(v))
    return {k: sum(v) / len(v) for k, v in sorted(acc.items())[:32]}
