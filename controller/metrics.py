"""Prometheus metrics of the controller, served at GET /metrics on its API port (bearer token like /v1).

Run figures are read from the database at scrape time (a custom collector), so they are right after a
restart and the same whichever controller replica answers:

    jetrl_controller_ledger_groups{run,state}      groups per ledger state (released ... dead_lettered)
    jetrl_controller_released_groups_total{run}    groups ever released
    jetrl_controller_release_rate{run}             groups released per second over the last RELEASE_WINDOW_S
    jetrl_controller_admission_bound{run}          groups the admission control lets out at this version
    jetrl_controller_current_version{run}          newest weight version announced
    jetrl_controller_api_request_seconds{method,route,status}  REST latency (histogram, route = the
        template, 'unmatched' for a request refused before routing: no token, unknown path)
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy import func, select

RELEASE_WINDOW_S = 60.0


class LedgerCollector:
    """Reads every run's ledger, admission bound and version when Prometheus scrapes."""

    def __init__(self, Session_):
        self.Session = Session_

    def collect(self):
        from controller import ledger, store
        from controller.db import Ledger, Run

        groups = GaugeMetricFamily("jetrl_controller_ledger_groups", "Groups per ledger state.", labels=["run", "state"])
        released = CounterMetricFamily("jetrl_controller_released_groups", "Groups ever released.", labels=["run"])
        rate = GaugeMetricFamily("jetrl_controller_release_rate",
                                 f"Groups released per second over the last {RELEASE_WINDOW_S:.0f} s.", labels=["run"])
        bound = GaugeMetricFamily("jetrl_controller_admission_bound",
                                  "Groups the admission control lets out at the current version.", labels=["run"])
        version = GaugeMetricFamily("jetrl_controller_current_version", "Newest weight version announced.",
                                    labels=["run"])
        now = time.time()
        with self.Session() as s:
            for r in s.scalars(select(Run).order_by(Run.created_at)):
                d = store.run_dict(s, r)
                for state, n in ledger.counts(s, r.id).items():
                    groups.add_metric([r.id, state], n)
                released.add_metric([r.id], d["ledger"]["released"])
                recent = s.scalar(select(func.count()).select_from(Ledger).where(
                    Ledger.run_id == r.id, Ledger.released_at > now - RELEASE_WINDOW_S)) or 0
                rate.add_metric([r.id], recent / RELEASE_WINDOW_S)
                bound.add_metric([r.id], d["admission_bound"])
                version.add_metric([r.id], r.current_version)
        yield from (groups, released, rate, bound, version)


class ControllerMetrics:
    def __init__(self, Session_):
        self.registry = CollectorRegistry()
        self.registry.register(LedgerCollector(Session_))
        self.api_seconds = Histogram("jetrl_controller_api_request_seconds", "REST request latency.",
                                     ["method", "route", "status"], registry=self.registry,
                                     buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))


class LatencyMiddleware:
    """Pure ASGI middleware timing every HTTP request under its route template (/v1/runs/{run})."""

    def __init__(self, app, metrics: ControllerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or ("/static" if scope.get("path", "").startswith("/static/")
                                                    else "unmatched")
            self.metrics.api_seconds.labels(scope.get("method", ""), path, str(status["code"])).observe(
                time.perf_counter() - t0)
