"""What a checkpoint costs the coordinator in messages grows with the
job's hosts, not with their processes (issue 33): each host's agent
answers every request for all of its processes in one line.  Counted, not
timed, with simulated hosts (tests/simulated_hosts.py) that speak the
agents' protocol over authenticated TCP to the real coordinator."""

import asyncio
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from ckpt import auth
from ckpt import manifest as manifests
from ckpt.coordinator import Coordinator
from tests.simulated_hosts import simulated_hosts


@pytest.fixture
def workdir():
    path = Path(tempfile.mkdtemp(prefix="ckm"))   # short: a Unix socket's path
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _messages_of_a_checkpoint(workdir, hosts, per_host):
    """({"sent": n, "received": n} of one checkpoint, its manifest)."""
    work = workdir / f"{hosts}x{per_host}"
    work.mkdir()
    secret = auth.create_secret_file(work / "secret")
    coord = Coordinator(job_id="msgs", socket_path=work / "c.sock", job_dir=work / "job",
                        command=["simulated"], secret=secret, warn=lambda message: None,
                        barrier_timeout=30)
    await coord.start()
    agents = asyncio.ensure_future(
        simulated_hosts(f"{socket.gethostname()}:{coord.tcp_port}", secret, hosts, per_host))
    try:
        assert await coord.wait_for_processes(hosts * per_host, 30)
        before = dict(coord.agent_messages)
        path, _warnings = await coord.checkpoint()
        counts = {key: coord.agent_messages[key] - before[key] for key in before}
        return counts, manifests.read_manifest(path)
    finally:
        await coord.close()
        await asyncio.wait_for(agents, 10)   # they end when the coordinator closes


def _counts(workdir, sizes):
    async def scenario():
        return [await _messages_of_a_checkpoint(workdir, hosts, per_host)
                for hosts, per_host in sizes]
    return asyncio.run(asyncio.wait_for(scenario(), 120))


def test_messages_per_checkpoint_grow_with_hosts_not_processes(workdir):
    sizes = [(4, 16), (4, 256), (2, 16), (8, 16)]
    (few, few_manifest), (many, many_manifest), (two, _), (eight, _) = _counts(workdir, sizes)
    # each checkpoint took every process: the counts are of complete rounds
    assert len(few_manifest["processes"]) == 64
    assert len(many_manifest["processes"]) == 1024
    assert sorted(many_manifest["hosts"]) == [f"sim{h:04d}" for h in range(4)]
    # 64 or 1,024 processes on 4 hosts: the same messages
    assert few == many
    # every request answered once by each host
    assert few["sent"] == few["received"] > 0
    # linear in hosts: 2 -> 4 -> 8 hosts add messages in proportion
    for key in ("sent", "received"):
        assert eight[key] - few[key] == 2 * (few[key] - two[key]) > 0
