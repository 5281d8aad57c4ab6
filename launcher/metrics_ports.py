"""Fixed Prometheus ports for the children of `jetrl up` / `jetrl demo` (docs/launch.md, "Metrics ports"):
`telemetry.metrics_base_port` + a fixed offset per child, passed as `telemetry.metrics_port=N` on its
command line. The controller and the weight store serve /metrics on their own API ports."""

from __future__ import annotations

import socket

from launcher.supervisor import ProcessSpec
from shared.runtime.natsd import free_port


def local_host(host: str) -> str:
    """The address to reach a server bound to `host` from this host."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


# Prometheus ports of the children: telemetry.metrics_base_port + these offsets (docs/launch.md). The
# controller and the weight store serve /metrics on their own API ports.
METRICS_OFFSETS = {"trainer": 1, "track": 3, "reward": 10, "rollout": 20}
METRICS_BLOCKS = 20  # a default base that is taken moves up by 100, this many times at most


def _metrics_offset(name: str) -> int | None:
    """'rollout-2' -> 22; None for a child without a metrics endpoint of its own."""
    kind, _, index = name.partition("-")
    base = METRICS_OFFSETS.get(kind)
    return None if base is None else base + (int(index) if index.isdigit() else 0)


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((local_host(host), port))
            return True
        except OSError:
            return False


class MetricsPortError(RuntimeError):
    pass


def assign_metrics_ports(specs: list[ProcessSpec], telemetry) -> dict[str, int]:
    """Give every child with a metrics endpoint its fixed port (`telemetry.metrics_port=N` on its command
    line); {child name: port}. metrics_port -1 turns them all off; metrics_base_port 0 picks free ports."""
    if telemetry.metrics_port < 0:
        return {}
    wanted = {s.name: off for s in specs if (off := _metrics_offset(s.name)) is not None}
    base = telemetry.metrics_base_port
    if base == 0:
        ports = {name: free_port() for name in wanted}
    else:
        explicit = "metrics_base_port" in telemetry.model_fields_set
        for _ in range(1 if explicit else METRICS_BLOCKS):
            ports = {name: base + off for name, off in wanted.items()}
            busy = [f"{p} ({n})" for n, p in ports.items() if p > 65535 or not _bindable(telemetry.metrics_host, p)]
            if not busy:
                break
            if explicit:
                raise MetricsPortError(f"metrics port(s) {', '.join(busy)} of telemetry.metrics_base_port={base} are "
                                       "in use: set telemetry.metrics_base_port to a free block (or 0 for free ports)")
            base += 100
        else:
            raise MetricsPortError(f"no free block of metrics ports from {telemetry.metrics_base_port} on: set "
                                   "telemetry.metrics_base_port (0 = free ports)")
    for s in specs:
        if s.name in ports:
            s.argv.append(f"telemetry.metrics_port={ports[s.name]}")
    return ports
