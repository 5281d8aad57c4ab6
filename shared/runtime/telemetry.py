"""Structured logging and Prometheus metrics, the same way in every service."""

from __future__ import annotations

import json
import logging
import sys
import time

from prometheus_client import CollectorRegistry, start_http_server

from shared.config import TelemetryConfig


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, plus any `extra={...}` fields."""

    _skip = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in record.__dict__.items():
            if k not in self._skip:
                out[k] = v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(cfg: TelemetryConfig | None = None, service: str = "jetrl") -> None:
    cfg = cfg or TelemetryConfig()
    handler = logging.StreamHandler(sys.stderr)
    if cfg.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)-7s {service} %(name)s: %(message)s",
                                               "%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(cfg.log_level)
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def start_metrics(cfg: TelemetryConfig, registry: CollectorRegistry | None = None) -> int | None:
    """Serve Prometheus /metrics for a service without an HTTP server of its own; returns the port.

    Services that already run FastAPI mount `prometheus_client.make_asgi_app()` at /metrics instead.
    """
    if cfg.metrics_port < 0:
        return None
    kwargs = {"registry": registry} if registry is not None else {}
    server, _ = start_http_server(cfg.metrics_port, addr=cfg.metrics_host, **kwargs)
    port = server.server_port
    logging.getLogger("jetrl.telemetry").info("metrics on http://%s:%d/metrics", cfg.metrics_host, port)
    return port


class Rate:
    """Events per second over a sliding window (for tokens/s, samples/s in status lines)."""

    def __init__(self, window_s: float = 30.0):
        self.window_s = window_s
        self._points: list[tuple[float, float]] = []

    def add(self, n: float) -> None:
        now = time.monotonic()
        self._points.append((now, n))
        cutoff = now - self.window_s
        while self._points and self._points[0][0] < cutoff:
            self._points.pop(0)

    def per_second(self) -> float:
        if len(self._points) < 2:
            return 0.0
        span = self._points[-1][0] - self._points[0][0]
        return sum(n for _, n in self._points[1:]) / span if span > 0 else 0.0
