"""The per-job coordinator: barriers over the job's processes, name service,
and the CLI's requests (docs/PROTOCOL.md).  Its own host's processes reach
it on a Unix socket; other hosts' agents and the CLI of any host over TCP,
authenticated by the job's secret before anything else."""

import asyncio
import contextlib
import gc
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from ckpt import auth, events, listen
from ckpt import manifest as manifests
from ckpt import verify
from ckpt.agent_link import AgentLink, describe_address
from ckpt.barrier import PhaseError, barrier
from ckpt.checkpoint import CheckpointedJob, CheckpointRun
from ckpt.errors import CkptError
from ckpt.headers import load_headers
from ckpt.local_processes import LocalProcesses, reply
from ckpt.names import NameService
from ckpt.pause import pause_before, pause_point
from ckpt.wire import escape, split_line
from ckpt.write_mode import COMPRESS_MODES, WriteMode

FIRST_HELLO_WAIT = 5.0  # the shim registers asynchronously at process start
TERMINATE_TIMEOUT = 2.0
CLIENT_ANSWER_WAIT = 0.1  # a checkpoint's client gets its answer before the coordinator closes  # a process busy elsewhere is killed without it


def stderr_warning(message):
    print(f"ckpt: warning: {message}", file=sys.stderr, flush=True)


class Coordinator:
    """One job's coordinator: registry of processes, barriers, name service."""

    def __init__(self, *, job_id, socket_path, job_dir, command, write_mode=WriteMode(),
                 barrier_timeout=120.0, keep=0, restarted_from=None, warn=stderr_warning,
                 on_kill=None, headers=None, first_hello_wait=FIRST_HELLO_WAIT, secret=None):
        self.job_id = job_id
        self.socket_path = str(socket_path)
        self.job_dir = Path(job_dir)
        self.command = list(command)
        self.write_mode = write_mode      # the job's; a checkpoint may override some
        self.barrier_timeout = barrier_timeout
        self.keep = keep
        self.restarted_from = restarted_from
        self.warn = warn
        self.on_kill = on_kill
        self.first_hello_wait = first_hello_wait
        self.headers = headers or load_headers()
        self.protocol_version = self.headers.const("CKPT_PROTOCOL_VERSION")
        self.line_max = self.headers.const("CKPT_LINE_MAX")
        # {process: None}, in the order they joined: a dict, so that a
        # process leaves in constant time (a big job's end is no quadratic)
        self.processes = {}
        self._restored_count = 0          # of them, restored ones
        self.joins = 0                    # processes that ever joined: did any since?
        self.names = NameService()
        self.checkpoints_taken = 0
        self.last_checkpoint = None
        self.running = None               # the CheckpointRun under way (status, progress)
        self.phase = None                 # the phase of the latest barrier
        self.interval = None              # periodic checkpoints: seconds between them
        self.next_checkpoint_at = None    # when the next periodic one starts
        self.killed = asyncio.Event()
        self.lost_hosts = {}              # host -> processes it had when its agent went away
        self.closing = False
        self._busy = asyncio.Lock()       # one checkpoint (or restart) at a time
        self.lazy_left = None             # a lazy restart's bytes still to come (--lazy)
        self._registered = asyncio.Condition()
        self._warnings = None             # collects WARNs during a checkpoint
        self._warned = set()              # warnings already shown on stderr
        self.secret = secret              # None: no TCP listener (tests)
        self.pause_point = pause_point()  # CKPT_PAUSE_BEFORE (ckpt/pause.py)
        self.tcp_port = None
        self.agents = []
        # lines to and from the agents (ckpt/agent_link.py): what a checkpoint
        # costs in messages grows with hosts, not with their processes
        self.agent_messages = {"sent": 0, "received": 0}
        self._tcp_servers = []
        self._tasks = set()
        self.local = LocalProcesses(
            socket_path, job_id=job_id, protocol_version=self.protocol_version,
            line_max=self.line_max, joined=self.add_process, left=self.remove_process,
            warned=lambda proc, message: self.note(f"{proc.describe()}: {message}"),
            name_service=self.names.answer, client=self._serve_client)

    # ---- sockets ------------------------------------------------------

    async def start(self):
        await self.local.start()
        if self.secret is not None:
            # every host's agent connects at once when a big job starts
            self._tcp_servers, self.tcp_port = await listen.start_servers(
                self._on_tcp_connect, socket.gethostname(), limit=16 * self.line_max,
                backlog=4096)

    async def close(self):
        self.closing = True
        await self._finish_checkpoint_under_way()
        for server in self._tcp_servers:
            server.close()
        self._tcp_servers = []
        for agent in list(self.agents):
            agent.close()
        await self.local.close()
        for task in list(self._tasks):
            task.cancel()

    async def _finish_checkpoint_under_way(self):
        """The job ended during a checkpoint: the checkpoint ends first, and
        its client hears how.  Once every image is taken it is still
        published (it is of the job before it ended); before that, its
        processes are gone and it is abandoned at once."""
        if not self._busy.locked():
            return
        try:
            await asyncio.wait_for(self._busy.acquire(), self.barrier_timeout)
        except asyncio.TimeoutError:
            return
        self._busy.release()
        await asyncio.sleep(CLIENT_ANSWER_WAIT)  # the answer on its way out

    def _spawn(self, coro):
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _on_tcp_connect(self, reader, writer):
        """An agent or a CLI of another host: it proves it knows the job's
        secret before anything it says is read."""
        where = describe_address(writer)
        try:
            try:
                await auth.server_handshake_async(reader, writer, self.secret)
            except auth.AuthError as exc:
                self.warn(f"refused a connection from {where}: {exc}")
                return
            word, rest = split_line(await reader.readline())
            if word == "AGENT":
                await self._serve_agent(rest, reader, writer)
            elif word == "CLIENT":
                await self._serve_client(rest, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, OSError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            writer.close()

    async def _serve_agent(self, rest, reader, writer):
        fields = rest.split()
        if len(fields) != 2 or fields[1] != str(self.protocol_version):
            await reply(writer, f"ERR protocol version, coordinator speaks {self.protocol_version}")
            return
        link = AgentLink(self, fields[0], reader, writer)
        await link.send(f"WELCOME {self.job_id}")
        self.agents.append(link)
        try:
            await link.serve()
        finally:
            self.agents.remove(link)

    def host_addresses(self):
        """{host: IPv4 address} of the job's hosts, as their agents' TCP
        connections show them (the coordinator's own: the address the
        agents reached)."""
        addresses = {}
        for agent in self.agents:
            addresses[agent.host] = agent.address
            addresses.setdefault(socket.gethostname(), agent.own_address)
        if not addresses:
            # no other host: its processes may still use its own address
            # between themselves (UCX's TCP lanes), which a restart on
            # another host must move
            try:
                own = socket.gethostbyname(socket.gethostname())
            except OSError:
                own = None
            if own and not own.startswith("127."):
                addresses[socket.gethostname()] = own
        return addresses

    # ---- processes ------------------------------------------------------

    async def add_process(self, proc):
        async with self._registered:
            self.processes[proc] = None
            self.joins += 1
            self._restored_count += proc.restored
            self._registered.notify_all()

    async def remove_process(self, proc):
        proc.wake()  # a barrier waiting on it learns it is gone
        async with self._registered:
            if self.processes.pop(proc, False) is None:
                self._restored_count -= proc.restored
            self._registered.notify_all()

    def host_lost(self, host, count):
        """host's agent went away while count processes of the job were
        there (the host died, or its network): unless the job is being
        killed, no checkpoint can be whole any more."""
        if self.killed.is_set() or self.closing or count == 0:
            return
        self.lost_hosts[host] = count
        self.warn(f"lost host {host} with {count} processes of the job")
        events.record(self.job_dir, "host_lost", {"job_id": self.job_id, "host": host,
                                                  "processes": count}, self.warn)

    def note(self, message):
        """A warning for the launcher's stderr and the running checkpoint's reply.

        Periodic checkpoints repeat the same warnings: stderr shows each once."""
        if message not in self._warned:
            self._warned.add(message)
            self.warn(message)
        if self._warnings is not None:
            self._warnings.append(message)

    async def _wait_registered(self, predicate, timeout):
        """Wait until predicate() holds as processes come and go; False on timeout."""
        async with self._registered:
            try:
                await asyncio.wait_for(self._registered.wait_for(predicate), timeout)
            except asyncio.TimeoutError:
                return False
        return True

    def _live_count(self, restored=None):
        # counted as they come and go: a wait for a big job's processes
        # looks at no list on each of their arrivals
        if restored is None:
            return len(self.processes)
        return self._restored_count if restored else len(self.processes) - self._restored_count

    async def wait_for_processes(self, count, timeout, restored=None):
        """Wait until `count` live processes registered; False on timeout."""
        return await self._wait_registered(lambda: self._live_count(restored) >= count, timeout)

    async def wait_for_ids(self, ids, timeout):
        """Wait until every (host, pid) in ids registered; False on timeout."""
        return await self._wait_registered(
            lambda: not ids or ids <= {(p.host, p.pid) for p in self._matching()}, timeout)

    def live_processes(self):
        return self._matching()

    async def wait_until_empty(self, settle=0.5):
        """Until no process of the job is left, or it was killed.  A child
        forked just before its parent ended has `settle` seconds to say
        HELLO."""
        while True:
            async with self._registered:
                await self._registered.wait_for(lambda: not self.processes)
            await asyncio.sleep(settle)
            if not self.processes:
                return

    def _matching(self, restored=None):
        return [p for p in self.processes if p.alive and (restored is None or p.restored == restored)]

    # ---- barriers and checkpoints -------------------------------------------

    async def barrier(self, phase, procs, arg=None, timeout=None, seq=0):
        """One barrier over procs; see ckpt.barrier.barrier."""
        self.headers.phase(phase)  # a misspelt phase fails here, not on the wire
        self.phase = phase  # the latest barrier's, for a restart's progress
        timeout = self.barrier_timeout if timeout is None else timeout
        await self.pause_before(phase, procs)
        return await barrier(phase, procs, timeout=timeout, arg=arg, seq=seq)

    async def pause_before(self, phase, procs):
        await pause_before(self.pause_point, phase, procs)

    async def checkpoint(self, kill=False, forked=None, compress=None):
        """Take one checkpoint; returns (published dir, warnings).

        forked: a copy-on-write child of each process writes its image
        while the job runs on (None: the job's default); compress: none,
        zstd or auto (None: the job's)."""
        mode = self.write_mode.overridden(forked=forked, compress=compress)
        async with self._busy:
            if self.lazy_left is not None:
                # the images hold memory the processes do not have yet: a
                # checkpoint now would save pages that are not there
                raise CkptError(f"a lazy restart is still bringing in {self.lazy_left} bytes of "
                                "the job's memory: checkpoint refused until the last page is in "
                                "(ckpt status shows what is left)")
            if self.lost_hosts:   # what is left of the job is no whole job
                host, count = next(iter(self.lost_hosts.items()))
                raise CkptError(f"host {host} was lost with {count} processes of the job: "
                                "no checkpoint of it can be complete")
            self._warnings = []
            try:
                procs = await self._first_processes()
                # open files claimed, sockets named in the last checkpoint
                # may have closed since
                self.names.forget_spent()
                self.running = self._checkpoint_run(procs, mode, kill)
                with no_cycle_collection():
                    final = await self.running.run()
                warnings = list(self._warnings)
                if kill:
                    await self._reset_connections()
            finally:
                self._warnings = None
                self.running = None
        self.checkpoints_taken += 1
        self.last_checkpoint = str(final)
        if kill:
            self.kill()
        else:
            manifests.prune(self.job_dir, self.keep)
        return final, warnings

    def _checkpoint_run(self, procs, mode, kill):
        job = CheckpointedJob(self.job_id, self.job_dir, self.command, self.restarted_from)
        return CheckpointRun(
            job, procs, mode, kill, barrier=self.barrier, pause_before=self.pause_before,
            live_processes=self.live_processes, joins=lambda: self.joins,
            wait_for_ids=self.wait_for_ids,
            names=self.names, note=self.note, warn=self.warn, warnings=self._warnings,
            host_addresses=self.host_addresses, barrier_timeout=self.barrier_timeout,
            fingerprint=lambda procs, directory: verify.after_write(self, procs, directory))

    async def _first_processes(self):
        if not self.processes:
            await self.wait_for_processes(1, self.first_hello_wait)
        procs = self._matching()
        if not procs:
            raise CkptError("no process registered with the coordinator (is the job running under the shim?)")
        return procs

    # ---- restart --------------------------------------------------------

    async def restart(self, expected_pids, timeout=None):
        """Wait for every restored process, then REBUILD, REFILL, RESUME ok."""
        timeout = self.barrier_timeout if timeout is None else timeout
        # a round too: the processes' arrivals, their cross-host connections
        # met through the name service (a pending request each), the phases
        async with self._busy:
            with no_cycle_collection():
                if not await self.wait_for_processes(len(expected_pids), timeout, restored=True):
                    have = len(self._matching(restored=True))
                    raise CkptError(f"only {have} of {len(expected_pids)} restored processes connected within {timeout:g} s")
                procs = self._matching(restored=True)
                unknown = sorted({p.pid for p in procs} - set(expected_pids))
                if unknown:
                    self.warn(f"restored processes {unknown} are not in the manifest")
                try:
                    for phase, arg in (("REBUILD", None), ("REFILL", None), ("RESUME", "ok")):
                        if phase == "RESUME":  # rebuilt, still parked: as the checkpoint saw them?
                            await verify.before_resume(self, procs)
                        _answers, gone = await self.barrier(phase, procs, arg, seq=self.restarted_from or 0)
                        if gone:
                            raise PhaseError(f"{gone[0].describe()} exited during {phase}")
                except PhaseError as exc:
                    raise CkptError(f"restart of job {self.job_id} failed: {exc}")

    # ---- periodic checkpoints and kill ------------------------------------

    async def periodic(self, interval):
        self.interval = interval
        while True:
            self.next_checkpoint_at = time.time() + interval
            await asyncio.sleep(interval)
            while self.lazy_left is not None:  # a lazy restart's pages come first
                await asyncio.sleep(0.1)
            if not self._matching():
                continue
            try:
                # shielded: stopping the periodic checkpoints never cuts
                # one short (a later checkpoint waits for it)
                taking = asyncio.ensure_future(self.checkpoint())
                taking.add_done_callback(_consume_exception)
                await asyncio.shield(taking)
            except CkptError as exc:
                self.warn(f"periodic checkpoint failed: {exc.message}")

    async def _reset_connections(self):
        """TERMINATE: the processes are about to die; their TCP connections
        end with a reset, so no TIME_WAIT holds the ports a restart on this
        host wants back."""
        procs = self._matching()
        if procs:
            try:
                await self.barrier("TERMINATE", procs, timeout=TERMINATE_TIMEOUT)
            except PhaseError:
                pass  # they die all the same

    async def terminate(self):
        """`ckpt kill`: reset connections (unless a checkpoint is in the
        way: then at once), then kill."""
        if not self._busy.locked():
            async with self._busy:
                await self._reset_connections()
        self.kill()

    def kill(self):
        """SIGKILL every known process by its real pid; the launcher then exits.

        All are stopped first: a process must not see another die (a pipe
        that ends, a parent gone) and act on it."""
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for agent in list(self.agents):
                agent.signal(sig)  # other hosts' processes, by their agents
            for proc in list(self.processes):
                if proc.agent is not None:
                    continue
                try:
                    os.kill(proc.real_pid, sig)
                except OSError:
                    pass
        if self.on_kill is not None:
            self.on_kill()
        self.killed.set()

    # ---- CLI clients ------------------------------------------------------

    async def _serve_client(self, rest, writer):
        command, *args = rest.split() or [""]
        if command == "CHECKPOINT":
            # shielded: a client that goes away does not cut a checkpoint short
            forked = True if "forked" in args else False if "inplace" in args else None
            compress = next((a.split("=", 1)[1] for a in args if a.startswith("compress=")), None)
            if compress not in COMPRESS_MODES:
                compress = None  # a client of another version: the job's default
            task = self._spawn(self.checkpoint(kill="kill" in args, forked=forked,
                                               compress=compress))
            try:
                path, warnings = await asyncio.shield(task)
                answer = " ".join(["OK", escape(path)] + [escape(w) for w in warnings])
            except CkptError as exc:
                answer = f"ERR {exc.message}"
        elif command == "STATUS":
            answer = "OK " + json.dumps(self.status(), separators=(",", ":"))
        elif command == "KILL":
            await self.terminate()
            answer = "OK"
        else:
            answer = f"ERR unknown command {command!r}"
        await reply(writer, answer)

    def status(self):
        return {
            "job_id": self.job_id,
            "launcher_pid": os.getpid(),
            "command": self.command,
            "job_dir": str(self.job_dir),
            "processes": [
                {"pid": p.pid, "real_pid": p.real_pid, "host": p.host, "restored": p.restored}
                for p in self._matching()
            ],
            "agents": [agent.host for agent in self.agents],
            "tcp_port": self.tcp_port,
            "checkpoints_taken": self.checkpoints_taken,
            "last_checkpoint": self.last_checkpoint,
            "busy": self._busy.locked(),
            "restarted_from": self.restarted_from,
            "checkpoint": self.running.progress() if self.running is not None else None,
            "interval": self.interval,
            "next_checkpoint_at": self.next_checkpoint_at,
            "stage_dir": str(self.write_mode.stage_dir) if self.write_mode.stage_dir else None,
            "lazy_bytes_left": self.lazy_left,
        }


@contextlib.contextmanager
def no_cycle_collection():
    """No cyclic garbage collection during a round (a checkpoint, a
    restart): what it makes per process (answers, manifest entries, pending
    name-service requests) lives until it ends, and each collection walked
    it again, and the job's registry with it (at 131,072 processes, a
    quarter of the round's time for nothing).  Reference counting frees the rest as ever; cycles wait for
    the end of the round."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _consume_exception(task):
    """A shielded task's failure is its awaiter's business; once nobody
    awaits it any more, asyncio must not report it as never retrieved."""
    if not task.cancelled():
        task.exception()
