"""Per-application limits of the online endpoint: requests and tokens per minute (token buckets that refill
continuously) and open sessions. Pure bookkeeping; the server asks before it works and charges after."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Bucket:
    """`capacity` per minute, refilled continuously; `level` may go below zero when a charge after the fact
    (a request's tokens) overdraws it, and then the application waits until it is positive again."""

    capacity: float
    level: float = field(default=None)  # type: ignore[assignment]
    at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.level is None:
            self.level = self.capacity

    def _refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + max(0.0, now - self.at) * self.capacity / 60.0)
        self.at = now

    def available(self, now: float | None = None) -> float:
        self._refill(time.monotonic() if now is None else now)
        return self.level

    def take(self, amount: float, now: float | None = None) -> None:
        self._refill(time.monotonic() if now is None else now)
        self.level -= amount

    def wait_s(self, now: float | None = None) -> float:
        """Seconds until the level is positive again (0 when it is)."""
        level = self.available(now)
        return 0.0 if level > 0 else (1.0 - level) * 60.0 / self.capacity


class AppLimits:
    """The limits of every application: `admit_request(app)` and `admit_tokens(app)` say why not (a message)
    or None; `charge_tokens(app, n)` counts what a request used."""

    def __init__(self, requests_per_min: int, tokens_per_min: int):
        self.requests_per_min, self.tokens_per_min = requests_per_min, tokens_per_min
        self._requests: dict[str, Bucket] = {}
        self._tokens: dict[str, Bucket] = {}

    def _bucket(self, table: dict[str, Bucket], app: str, capacity: int) -> Bucket:
        b = table.get(app)
        if b is None:
            b = table[app] = Bucket(float(capacity))
        return b

    def admit_request(self, app: str, now: float | None = None) -> str | None:
        b = self._bucket(self._requests, app, self.requests_per_min)
        if b.available(now) < 1:
            return (f"application {app} is over rollout.online.requests_per_min = {self.requests_per_min}; "
                    f"retry in {b.wait_s(now):.1f} s")
        b.take(1, now)
        return None

    def admit_tokens(self, app: str, now: float | None = None) -> str | None:
        b = self._bucket(self._tokens, app, self.tokens_per_min)
        if b.available(now) <= 0:
            return (f"application {app} has used its rollout.online.tokens_per_min = {self.tokens_per_min}; "
                    f"retry in {b.wait_s(now):.1f} s")
        return None

    def charge_tokens(self, app: str, n: int, now: float | None = None) -> None:
        self._bucket(self._tokens, app, self.tokens_per_min).take(n, now)

    def retry_after(self, app: str) -> int:
        waits = [t[app].wait_s() for t in (self._requests, self._tokens) if app in t]
        return max(1, int(max(waits, default=1.0) + 0.999))
