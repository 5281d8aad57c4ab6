"""`jetrl trainer -c CONFIG [--resume] [overrides]`."""

from __future__ import annotations

import os
import sys

import typer

from shared.runtime.cliutil import CONFIG_OPTION, OVERRIDES_ARG, load_or_exit


def torchrun_argv(nproc: int, config: str | None, resume: bool, overrides: list[str], nnodes: int = 1,
                  node_rank: int = 0, master_addr: str = "", master_port: int = 29400, rdzv_id: str = "",
                  rdzv_backend: str = "static") -> list[str]:
    """The torchrun command of this node: `--standalone` on one host. With nnodes > 1 every node joins the
    rendezvous endpoint master_addr:master_port: `static` (node_rank fixes the global ranks, node 0 hosts
    the store and rank 0, which publishes) or `c10d` (elastic: ranks in order of arrival)."""
    argv = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1:
        argv += ["--standalone"]
    elif rdzv_backend == "static":
        argv += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=static",
                 f"--master-addr={master_addr}", f"--master-port={master_port}",
                 f"--local-addr={_local_addr(master_addr)}"]
    else:
        argv += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={master_addr}:{master_port}",
                 f"--rdzv-id={rdzv_id or 'jetrl'}", f"--local-addr={_local_addr(master_addr)}"]
    argv += [f"--nproc-per-node={nproc}", "-m", "trainer_service.main"]
    if config:
        argv += ["-c", config]
    if resume:
        argv.append("--resume")
    return argv + list(overrides)


def _local_addr(master_addr: str) -> str:
    """This host's address on the route to master_addr (what other nodes reach this one by): torchrun
    otherwise advertises the host name, which other hosts may not resolve."""
    from shared.runtime.netaddr import address_toward

    return address_toward(master_addr)


def _ifname_of(addr: str) -> str | None:
    """The network interface holding IPv4 address `addr` (Linux), or None."""
    import fcntl
    import socket
    import struct

    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue
        if socket.inet_ntoa(raw[20:24]) == addr:
            return name
    return None


def node_env(master_addr: str) -> dict[str, str]:
    """Environment of a multi-node trainer: gloo and NCCL bind to the interface that reaches master_addr
    (by default they bind to whatever the host name resolves to, often a loopback address) unless the
    user chose one (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)."""
    ifname = _ifname_of(_local_addr(master_addr))
    if not ifname:
        return {}
    return {k: ifname for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if k not in os.environ}


def register(app: typer.Typer) -> None:
    @app.command("trainer")
    def trainer(
        config: str = CONFIG_OPTION,
        resume: bool = typer.Option(False, "--resume", help="Continue from the latest checkpoint of the run."),
        overrides: list[str] = OVERRIDES_ARG,
    ) -> None:
        """Train on the run's trajectory groups and publish every new policy version."""
        cfg = load_or_exit(config, overrides)
        t = cfg.trainer
        if (t.nproc > 1 or t.nnodes > 1) and "WORLD_SIZE" not in os.environ:
            argv = torchrun_argv(t.nproc, config, resume, overrides or [], nnodes=t.nnodes, node_rank=t.node_rank,
                                 master_addr=t.master_addr, master_port=t.master_port, rdzv_id=t.rdzv_id or cfg.run,
                                 rdzv_backend=t.rdzv_backend)
            if t.nnodes > 1:
                os.environ.update(node_env(t.master_addr))
            os.execv(argv[0], argv)
        from trainer_service.main import main

        args = (["-c", config] if config else []) + (["--resume"] if resume else []) + list(overrides or [])
        raise typer.Exit(main(args))
