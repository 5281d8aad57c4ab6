"""The trainer over two hosts x one rank (`jetrl trainer` with trainer.nnodes=2: torchrun with a c10d
rendezvous at node 0's address, gloo across the bridge) trains the same weights as one process on the
same trajectory groups. NATS runs on a third host."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.testing import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
from trainer_testlib import make_group, publish_groups, trainer_overrides  # noqa: E402

from shared.config import NatsConfig, StreamsConfig  # noqa: E402
from shared.contract import bus  # noqa: E402
from shared.runtime.credentials import new_token, write_private  # noqa: E402

CLI = [sys.executable, "-m", "launcher.cli"]
STEPS, BATCH = 2, 2


def _final_weights(publish_dir: Path, run: str) -> dict[str, torch.Tensor]:
    versions = sorted((publish_dir / run).glob("v*"), key=lambda p: int(p.name[1:]))
    assert int(versions[-1].name[1:]) == STEPS, versions
    return load_file(str(versions[-1] / "model.safetensors"))


async def _train(net, hosts: list[str], nats_url: str, js, nc, tmp: Path, run: str, **extra) -> dict:
    await publish_groups(js, nc, [make_group(run, i, rewards=(1.0, 0.0, 0.5, 0.0)) for i in range(STEPS * BATCH)])
    ov = trainer_overrides(nats_url, tmp, run, **{"schedule.total_steps": STEPS, "schedule.batch_size": BATCH,
                                                   "trainer.device": "cpu", "trainer.optim.lr": 0.01,
                                                   "trainer.optim.adam_eps": 1e-4, **extra})
    procs = []
    for rank, host in enumerate(hosts):
        node = ([f"trainer.nnodes={len(hosts)}", f"trainer.node_rank={rank}",
                 f"trainer.master_addr={net.addr(hosts[0])}"] if len(hosts) > 1 else [])
        procs.append(net.spawn(host, CLI + ["trainer", *ov, *node], env={"OMP_NUM_THREADS": "1"},
                               log=tmp / f"trainer-{run}-{host}.log", cwd=Path(__file__).resolve().parents[2]))
    logs = [tmp / f"trainer-{run}-{host}.log" for host in hosts]
    for rank, p in enumerate(procs):
        try:
            code = await asyncio.to_thread(p.wait, 240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            tails = "\n".join(f"--- node {r}:\n{f.read_text(errors='replace')[-3000:]}" for r, f in enumerate(logs))
            pytest.fail(f"node {rank} still running after 240 s\n{tails}")
        log = logs[rank].read_text(errors="replace")
        assert code == 0, f"node {rank} exited {code}:\n{log[-4000:]}"
    return _final_weights(tmp / "published", run)


@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_two_nodes_one_rank_each_match_one_process(hostnet, tmp_path):
    net = hostnet(["a", "b", "c"])
    token = write_private(tmp_path / "nats.token", new_token() + "\n")
    nats = net.spawn("a", CLI + ["nats", "--host", net.addr("a"), "--port", "4222", "--store-dir",
                                 str(tmp_path / "nats"), "--token-file", str(token)], log=tmp_path / "nats.log")
    url = f"nats://{net.addr('a')}:4222"
    nc = await bus.connect(NatsConfig(servers=[url], token_file=str(token)), name="multinode-test")
    try:
        js = nc.jetstream()
        await bus.ensure_streams(js, StreamsConfig(duplicate_window_s=120))
        auth = {"nats.token_file": str(token)}
        two = await _train(net, ["b", "c"], url, js, nc, tmp_path, "mn2", **auth)
        one = await _train(net, ["b"], url, js, nc, tmp_path, "mn1", **auth)
    finally:
        await nc.close()
    assert nats.poll() is None
    logs = {h: (tmp_path / f"trainer-mn2-{h}.log").read_text() for h in "bc"}
    assert "published version 2" in logs["b"] and "published version" not in logs["c"]  # node 0 holds rank 0
    assert "world size 2" in logs["b"], logs["b"][-2000:]
    assert set(one) == set(two)
    for k in one:
        assert_close(two[k], one[k], rtol=1e-4, atol=2e-5, msg=f"{k} differs between 2 nodes and 1 process")


def test_the_torchrun_command_of_a_node_and_the_config_checks():
    from shared.config import ConfigError, JetrlConfig, load_config
    from trainer_service.cli import torchrun_argv

    argv = torchrun_argv(2, "run.yaml", True, ["x=1"], nnodes=3, node_rank=1, master_addr="127.0.0.1", master_port=29555)
    i = argv.index("torch.distributed.run") + 1
    assert argv[i:i + 6] == ["--nnodes=3", "--node-rank=1", "--rdzv-backend=static", "--master-addr=127.0.0.1",
                             "--master-port=29555", "--local-addr=127.0.0.1"]
    assert argv[-6:] == ["-m", "trainer_service.main", "-c", "run.yaml", "--resume", "x=1"]
    assert "--nproc-per-node=2" in argv and "--standalone" not in argv
    elastic = torchrun_argv(1, None, False, [], nnodes=2, master_addr="127.0.0.1", rdzv_backend="c10d", rdzv_id="r")
    assert {"--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400", "--rdzv-id=r"} <= set(elastic)
    assert "--standalone" in torchrun_argv(2, None, False, [])
    with pytest.raises((ConfigError, ValueError), match="trainer.master_addr"):
        load_config(JetrlConfig, None, ["trainer.nnodes=2"])
    with pytest.raises((ConfigError, ValueError), match="trainer.node_rank"):
        load_config(JetrlConfig, None, ["trainer.nnodes=2", "trainer.node_rank=2", "trainer.master_addr=h"])
