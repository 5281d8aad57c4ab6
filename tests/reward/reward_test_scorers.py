"""Custom scorers for the reward tests, named by import path ('reward_test_scorers:...').

Importable because pytest puts tests/reward on sys.path; subprocess replicas get it on PYTHONPATH.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def slow_and_tell(completion: str, reference, payload: dict):
    """Writes '<pid>' to payload['marker_dir']/<pid> when it starts, then sleeps payload['sleep_s']."""
    marker_dir = payload.get("marker_dir")
    if marker_dir:
        Path(marker_dir, str(os.getpid())).write_text(str(os.getpid()))
    time.sleep(float(payload.get("sleep_s", 0)))
    return 1.0 if completion == reference else 0.0, {"pid": os.getpid()}


def length(completion: str, reference, payload: dict) -> float:
    return float(len(completion))


def broken(completion: str, reference, payload: dict) -> float:
    raise RuntimeError("this scorer always fails")


def not_a_number(completion: str, reference, payload: dict):
    return "high"


def spin_forever(completion: str, reference, payload: dict) -> float:
    if completion == "hang":
        while True:
            pass
    return 1.0


def unencodable_metrics(completion: str, reference, payload: dict):
    return 1.0, {"value": object()}
