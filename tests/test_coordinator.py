"""Protocol tests of the coordinator, driven by fake shim processes."""

import asyncio
import json
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from ckpt import coordinator as coordinator_module
from ckpt import listen
from ckpt import manifest as m
from ckpt.coordinator import Coordinator
from ckpt.errors import CkptError
from tests.fakeshim import FakeProcess
from ckpt.image import verify_checkpoint
from ckpt.wire import unescape
from ckpt.write_mode import WriteMode

CHECKPOINT_PHASES = ["STOP", "RELEASE", "SUSPEND", "DRAIN", "FLUSH", "WRITE", "RESUME"]


@pytest.fixture
def workdir():
    # short path: Unix socket names must stay under 108 bytes
    path = Path(tempfile.mkdtemp(prefix="ckc"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Harness:
    def __init__(self, workdir, **options):
        self.warnings = []
        self.killed = []
        self.job_dir = workdir / "images" / "job1"
        options.setdefault("barrier_timeout", 5.0)
        options.setdefault("first_hello_wait", 0.3)
        self.coord = Coordinator(job_id="job1", socket_path=workdir / "c.sock", job_dir=self.job_dir,
                                 command=["app", "arg"], warn=self.warnings.append,
                                 on_kill=lambda: self.killed.append(True), **options)
        self.fakes = []

    async def __aenter__(self):
        await self.coord.start()
        return self

    async def __aexit__(self, *exc):
        for fake in self.fakes:
            await fake.close()
        await self.coord.close()

    async def process(self, pid, **options):
        fake = await FakeProcess(self.coord.socket_path, pid, **options).connect()
        self.fakes.append(fake)
        # registration happens after WELCOME; give the coordinator a turn
        for _ in range(100):
            if any(p.pid == pid for p in self.coord.processes):
                break
            await asyncio.sleep(0.01)
        return fake

    async def client(self, command):
        reader, writer = await asyncio.open_unix_connection(self.coord.socket_path)
        writer.write(f"CLIENT {command}\n".encode())
        await writer.drain()
        reply = (await reader.readline()).decode().strip()
        writer.close()
        return reply


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def names(fake):
    return [name for name, _ in fake.phases]


def test_socket_is_private(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            assert os.stat(h.coord.socket_path).st_mode & 0o777 == 0o600
    run(scenario())


def test_tcp_listens_on_the_addresses_of_its_host_name(workdir):
    """Other hosts reach the coordinator by its host name: it listens on the
    addresses that name resolves to, all on one port, and answers there
    (this machine's name resolves to loopback: every interface)."""
    async def scenario():
        async with Harness(workdir, secret=b"s" * 32) as h:
            bound = {s.getsockname() for server in h.coord._tcp_servers
                     for s in server.sockets}
            expected = listen.reachable_addresses(socket.gethostname())
            assert bound == {(address, h.coord.tcp_port) for address in expected}
            reader, writer = await asyncio.open_connection(socket.gethostname(), h.coord.tcp_port)
            writer.close()
        assert h.coord._tcp_servers == []
    run(scenario())


def test_which_addresses_a_host_name_gives():
    """(A host name of the namespace cluster's gives its own address only:
    integration/test_multihost.py's agents reach their coordinator there.)"""
    assert listen.reachable_addresses("no-such-host.invalid") == ["0.0.0.0"]
    # Debian's /etc/hosts maps the host's own name to 127.0.1.1: other hosts
    # reach it by another address, so every interface
    assert listen.reachable_addresses("localhost") == ["0.0.0.0"]


def test_full_checkpoint_with_three_processes(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            fakes = [await h.process(pid) for pid in (101, 102, 103)]
            assert fakes[0].welcome == "WELCOME job1"
            path, warnings = await h.coord.checkpoint()
            assert path == h.job_dir / "ckpt-0001" and warnings == []
            for fake in fakes:
                assert names(fake) == CHECKPOINT_PHASES
                assert re.fullmatch(r"[0-9a-f]{32}", fake.phases[4][1])  # FLUSH's marker
                assert unescape(fake.phases[5][1]) == str(h.job_dir / ".ckpt-0001.tmp")
                assert fake.phases[6][1] == "ok"
            manifest = verify_checkpoint(path)
            assert sorted(p["pid"] for p in manifest["processes"]) == [101, 102, 103]
            assert manifest["command"] == ["app", "arg"]
            assert all(p["stopped_ns"] == 2000 and p["threads"] == 1 for p in manifest["processes"])
            assert fakes[0].seqs == [1] * 7  # seq: the checkpoint number
            path2, _ = await h.coord.checkpoint()
            assert path2.name == "ckpt-0002"
            assert fakes[0].seqs[7:] == [2] * 7
            assert fakes[0].phases[4][1] != fakes[0].phases[11][1], "the same marker twice"
            assert os.readlink(h.job_dir / "latest") == "ckpt-0002"
    run(scenario())


def test_write_words_follow_the_jobs_write_mode(workdir, monkeypatch):
    """The job's WriteMode reaches WRITE; a checkpoint overrides its
    compression; --kill writes in place, unstaged."""
    monkeypatch.setattr(coordinator_module.os, "kill", lambda pid, sig: None)  # the fake is us
    mode = WriteMode(compress="zstd", full_every=4, stage_dir=workdir / "stage")

    async def scenario():
        async with Harness(workdir, write_mode=mode) as h:
            fake = await h.process(7)
            await h.coord.checkpoint(compress="none", kill=True)
            directory, *words = fake.phases[5][1].split(" ")
            assert unescape(directory) == str(h.job_dir / ".ckpt-0001.tmp")
            assert words == ["incremental"]
            manifest = m.read_manifest(h.job_dir / "ckpt-0001")
            assert (manifest["full_every"], manifest["stage_dir"]) == (4, None)
    run(scenario())
    assert mode.write_words() == " zstd incremental"


def test_fail_at_write_aborts_and_keeps_previous(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            fakes = [await h.process(pid) for pid in (1, 2, 3)]
            first, _ = await h.coord.checkpoint()
            for fake in fakes:
                fake.phases.clear()
            fakes[1].script["WRITE"] = "fail"
            with pytest.raises(CkptError, match="WRITE failed in process 2.*: fake failure"):
                await h.coord.checkpoint()
            for fake in fakes:
                assert fake.phases[-1] == ("RESUME", "abort")
                assert ("RESUME", "ok") not in fake.phases
            assert not list(h.job_dir.glob(".ckpt-*"))
            assert os.readlink(h.job_dir / "latest") == "ckpt-0001"
            verify_checkpoint(first)
            # the job keeps going: the next checkpoint works (the failed number is free again)
            fakes[1].script.clear()
            path, _ = await h.coord.checkpoint()
            assert path.name == "ckpt-0002"
    run(scenario())


def test_client_gets_err_line_on_failure(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            await h.process(1, script={"SUSPEND": "fail"})
            reply = await h.client("CHECKPOINT")
            assert reply.startswith("ERR ") and "SUSPEND failed" in reply
    run(scenario())


@pytest.mark.parametrize("phase", ["STOP", "RELEASE", "SUSPEND"])
def test_process_exiting_on_its_way_to_suspend_is_left_out(workdir, phase):
    async def scenario():
        async with Harness(workdir) as h:
            await h.process(1)
            await h.process(2, script={phase: "disconnect"})
            path, warnings = await h.coord.checkpoint()
            manifest = verify_checkpoint(path)
            assert [p["pid"] for p in manifest["processes"]] == [1]
            assert any("process 2" in w and "left out" in w for w in warnings)
            assert sorted(f.name for f in path.iterdir()) == ["manifest.yaml", "proc-1.img"]
            assert [p.pid for p in h.coord.processes] == [1]
    run(scenario())


@pytest.mark.parametrize("phase", ["DRAIN", "FLUSH", "WRITE"])
def test_process_dying_while_suspended_abandons_the_checkpoint(workdir, phase):
    """Suspended, a process cannot exit by itself: it was killed, and the
    job changed under the checkpoint.  No checkpoint is published; the
    others are resumed."""
    async def scenario():
        async with Harness(workdir) as h:
            await h.process(1)
            await h.process(2, script={phase: "disconnect"})
            with pytest.raises(CkptError, match=rf"process 2 .*died while suspended, during {phase}"):
                await h.coord.checkpoint()
            assert not list(h.job_dir.glob("ckpt-*")) and not list(h.job_dir.glob(".ckpt-*"))
    run(scenario())


def test_everyone_leaving_fails_cleanly(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            await h.process(1, script={"SUSPEND": "disconnect"})
            with pytest.raises(CkptError, match="exited during the checkpoint"):
                await h.coord.checkpoint()
            assert not list(h.job_dir.glob(".ckpt-*"))
    run(scenario())


def test_barrier_timeout(workdir):
    async def scenario():
        async with Harness(workdir, barrier_timeout=0.3) as h:
            ok = await h.process(1)
            hung = await h.process(2, script={"DRAIN": "hang"})
            with pytest.raises(CkptError, match=r"DRAIN timed out after 0.3 s waiting for process 2"):
                await h.coord.checkpoint()
            await asyncio.sleep(0.05)
            assert ok.phases[-1] == ("RESUME", "abort")
            assert hung.phases[-1] == ("RESUME", "abort")
            assert not list(h.job_dir.glob(".ckpt-*"))
    run(scenario())


def test_unwritable_checkpoint_dir_fails_before_suspending(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            blocker = h.job_dir.parent
            blocker.parent.mkdir(parents=True, exist_ok=True)
            blocker.write_text("a file where the directory should be")
            fake = await h.process(1)
            with pytest.raises(CkptError, match="cannot write checkpoint directory"):
                await h.coord.checkpoint()
            assert fake.phases == []
    run(scenario())


def test_checkpoint_waits_briefly_for_the_first_process(workdir):
    async def scenario():
        async with Harness(workdir, first_hello_wait=2.0) as h:
            pending = asyncio.ensure_future(h.coord.checkpoint())
            await asyncio.sleep(0.2)
            await h.process(5)
            path, _ = await pending
            assert path.name == "ckpt-0001"
    run(scenario())


def test_no_process_registered(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            reply = await h.client("CHECKPOINT")
            assert reply.startswith("ERR no process registered")
    run(scenario())


def test_checkpoints_are_serialized(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            await h.process(1)
            results = await asyncio.gather(h.client("CHECKPOINT"), h.client("CHECKPOINT"))
            paths = sorted(Path(r.split()[1]).name for r in results)
            assert paths == ["ckpt-0001", "ckpt-0002"]
    run(scenario())


def test_warn_reaches_stderr_and_the_reply(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            fake = await h.process(1)
            await fake.send("WARN fd 5 is connected outside the job")
            await asyncio.sleep(0.05)
            assert len(h.warnings) == 1
            assert h.warnings[0].startswith("process 1")
            assert h.warnings[0].endswith(": fd 5 is connected outside the job")
            fake.script["DRAIN"] = "warn pipe to outside"
            ok, path, *warnings = (await h.client("CHECKPOINT")).split(" ")
            assert ok == "OK" and len(warnings) == 1
            assert unescape(warnings[0]).endswith(": pipe to outside")
            recorded = m.read_manifest(unescape(path))["warnings"]
            assert recorded == [unescape(warnings[0])]
    run(scenario())


def test_put_get(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            a = await h.process(1)
            b = await h.process(2)
            assert await a.put("qp.1", "0x1234") == "OK"
            assert await b.get("qp.1") == "VAL 0x1234"
            assert await b.get("qp.2") == "NONE"
    run(scenario())


async def name_service(path):
    """A plugin thread's own connection: name service only."""
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"KV\n")

    async def ask(line):
        writer.write(f"{line}\n".encode())
        await writer.drain()
        return (await reader.readline()).decode().strip()
    return ask, writer


def test_name_service_connection_batches_counters_and_waits(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            ask, writer = await name_service(h.coord.socket_path)
            other, other_writer = await name_service(h.coord.socket_path)
            assert await ask("MPUT ib:1:qp:5 7.9.a ib:1:lid:7 8") == "OK"
            assert await other("GET ib:1:lid:7") == "VAL 8"
            assert await other("MWAIT 1 ib:1:qp:5 ib:1:lid:7") == "VAL 7.9.a 8"
            # MWAIT blocks until every key is there, or says which are missing
            waiting = asyncio.ensure_future(other("MWAIT 5 ib:1:qp:6 ib:1:lid:7"))
            await asyncio.sleep(0.1)
            assert not waiting.done()
            assert await ask("PUT ib:1:qp:6 1.2.b") == "OK"
            assert await waiting == "VAL 1.2.b 8"
            assert await ask("MWAIT 0.1 ib:1:qp:99") == "NONE ib:1:qp:99"
            # a counter barrier: AWAIT returns once the count is reached
            assert await ask("INCR ib:1:ready") == "VAL 1"
            waiting = asyncio.ensure_future(ask("AWAIT 5 ib:1:ready 2"))
            await asyncio.sleep(0.1)
            assert not waiting.done()
            assert await other("INCR ib:1:ready") == "VAL 2"
            assert await waiting == "VAL 2"
            assert await other("AWAIT 0.1 ib:1:ready 3") == "NONE 2"
            assert (await other("CHECKPOINT now")).startswith("ERR")
            writer.close()
            other_writer.close()
    run(scenario())


def test_status_and_unknown_command(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            await h.process(9)
            ok, _, body = (await h.client("STATUS")).partition(" ")
            info = json.loads(body)
            assert ok == "OK" and info["job_id"] == "job1"
            assert [p["pid"] for p in info["processes"]] == [9]
            assert (await h.client("FROB")).startswith("ERR unknown command")
    run(scenario())


def test_checkpoint_kill_publishes_then_terminates_and_kills_without_resume(workdir, monkeypatch):
    signalled = []
    monkeypatch.setattr(coordinator_module.os, "kill", lambda pid, sig: signalled.append((pid, sig)))

    async def scenario():
        async with Harness(workdir) as h:
            fake = await h.process(1)
            reply = await h.client("CHECKPOINT kill")
            assert reply.startswith("OK ") and reply.endswith("ckpt-0001")
            # no RESUME: TERMINATE lets the job reset its TCP connections
            assert names(fake) == ["STOP", "RELEASE", "SUSPEND", "DRAIN", "FLUSH", "WRITE", "TERMINATE"]
            assert signalled == [(os.getpid(), 19), (os.getpid(), 9)]  # stopped, then killed
            assert h.killed and h.coord.killed.is_set()
            verify_checkpoint(h.job_dir / "latest")
    run(scenario())


def test_restart_phases_in_order_after_every_process_is_back(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            restart = asyncio.ensure_future(h.coord.restart([1, 2], timeout=5))
            first = await h.process(1, restored=True)
            await asyncio.sleep(0.1)
            assert first.phases == []  # still waiting for process 2
            second = await h.process(2, restored=True)
            await restart
            for fake in (first, second):
                assert fake.phases == [("REBUILD", None), ("REFILL", None), ("RESUME", "ok")]
            # after the restart, checkpoints continue numbering in the job dir
            h.job_dir.mkdir(parents=True)
            (h.job_dir / "ckpt-0004").mkdir()
            path, _ = await h.coord.checkpoint()
            assert path.name == "ckpt-0005"
    run(scenario())


def test_restart_fails_when_a_process_never_comes_back(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            await h.process(1, restored=True)
            with pytest.raises(CkptError, match="only 1 of 2 restored processes"):
                await h.coord.restart([1, 2], timeout=0.2)
    run(scenario())


def test_restart_fail_in_rebuild(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            await h.process(1, restored=True, script={"REBUILD": "fail"})
            with pytest.raises(CkptError, match="REBUILD failed in process 1"):
                await h.coord.restart([1], timeout=1)
    run(scenario())


def test_keep_prunes_old_checkpoints(workdir):
    async def scenario():
        async with Harness(workdir, keep=2) as h:
            await h.process(1)
            for _ in range(3):
                await h.coord.checkpoint()
            assert [n for n, _ in m.published_checkpoints(h.job_dir)] == [2, 3]
    run(scenario())


def test_protocol_version_mismatch_is_refused(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            reader, writer = await asyncio.open_unix_connection(h.coord.socket_path)
            writer.write(b"HELLO 1 0 host 999\n")
            assert (await reader.readline()).startswith(b"ERR protocol version 999")
            writer.close()
            assert list(h.coord.processes) == []
    run(scenario())


def test_process_exiting_right_after_resume_keeps_its_image(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            await h.process(1)
            await h.process(2, script={"RESUME ok": "disconnect"})
            path, _ = await h.coord.checkpoint()
            manifest = verify_checkpoint(path)
            assert sorted(p["pid"] for p in manifest["processes"]) == [1, 2]
    run(scenario())


def test_repeated_warnings_are_shown_once_but_recorded_each_time(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            await h.process(1, script={"DRAIN": "warn fd 7 is a socket to outside"})
            _, first = await h.coord.checkpoint()
            _, second = await h.coord.checkpoint()
            assert len(first) == len(second) == 1
            assert len(h.warnings) == 1
    run(scenario())


def test_client_going_away_does_not_cut_the_checkpoint_short(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            fake = await h.process(1, script={"DRAIN": "hang"})
            reader, writer = await asyncio.open_unix_connection(h.coord.socket_path)
            writer.write(b"CLIENT CHECKPOINT\n")
            await writer.drain()
            while "DRAIN" not in names(fake):
                await asyncio.sleep(0.01)
            writer.close()
            await asyncio.sleep(0.05)
            await fake.send("DONE DRAIN 0")
            for _ in range(200):
                if m.published_checkpoints(h.job_dir):
                    break
                await asyncio.sleep(0.01)
            assert names(fake) == CHECKPOINT_PHASES
            assert [n for n, _ in m.published_checkpoints(h.job_dir)] == [1]
    run(scenario())


def test_process_arriving_mid_checkpoint_is_not_part_of_it(workdir):
    async def scenario():
        async with Harness(workdir) as h:
            first = await h.process(1, script={"DRAIN": "hang"})
            pending = asyncio.ensure_future(h.coord.checkpoint())
            while "DRAIN" not in names(first):
                await asyncio.sleep(0.01)
            late = await h.process(2)
            await first.send("DONE DRAIN 0")
            path, warnings = await pending
            assert late.phases == []
            assert [p["pid"] for p in verify_checkpoint(path)["processes"]] == [1]
            assert any("process 2" in w and "not part of it" in w for w in warnings)
    run(scenario())
