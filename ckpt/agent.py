"""`ckpt agent`: the job's agent on one host other than the coordinator's.

ckpt-remote starts it (detached) before the first process of the job runs
on the host.  It serves the host's processes on the job's Unix socket path
(host-local, as $CKPT_COORD names it) and speaks for all of them to the
coordinator over one authenticated TCP connection ($CKPT_COORD_TCP, the
secret's path in $CKPT_SECRET_FILE; docs/PROTOCOL.md, "Host agents").  It
ends when the coordinator closes that connection."""

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

from ckpt import auth
from ckpt import image_check
from ckpt import stopped as stopped_processes
from ckpt import verify
from ckpt.barrier import PhaseError, barrier
from ckpt.errors import CkptError
from ckpt.headers import integer_constants
from ckpt.local_processes import LocalProcesses
from ckpt.wire import escape, split_line, unescape

CONNECT_TIMEOUT = 10.0


class HostAgent:
    def __init__(self, *, job_id, socket_path, address, secret):
        self.job_id = job_id
        self.address = address
        self.secret = secret
        self.host = socket.gethostname()
        constants = integer_constants()
        self.protocol_version = constants["CKPT_PROTOCOL_VERSION"]
        self.line_max = constants["CKPT_LINE_MAX"]
        self.local = LocalProcesses(
            socket_path, job_id=job_id, protocol_version=self.protocol_version,
            line_max=self.line_max, joined=self._joined, left=self._left,
            warned=self._warned, name_service=self._name_service)
        self.procs = {}          # tag -> Process
        self._next_tag = 0
        self._next_request = 0
        self._requests = {}      # name-service request id -> future of the answer
        self._tasks = set()
        self.reader = self.writer = None
        self.child = None        # a restart's ckpt-restart (--run, --adopt): its pid
        self.thawed = []         # this checkpoint's stopped processes, thawed
        self.checkpoint_dir = {}  # checkpoint number -> its directory, from WRITE (for SYNC)

    async def run(self, command=(), adopted=None):
        """Serve the host until the coordinator closes the connection; with
        a command (a restart's ckpt-restart), or the pid of one already
        started as our child (`adopted`), until it ends too: returns its
        exit status."""
        self.child = adopted
        try:
            await self._connect()
            await self.local.start()
        except BaseException:
            self._kill_child()  # a restart that cannot reach its job
            raise
        link = asyncio.ensure_future(self._serve_link())
        try:
            if not command and adopted is None:
                await link
                return 0
            if command:
                process = await asyncio.create_subprocess_exec(*command)
                self.child, waiting = process.pid, process.wait()
            else:
                waiting = child_exit(adopted)
            ended = asyncio.ensure_future(waiting)
            await asyncio.wait([link, ended], return_when=asyncio.FIRST_COMPLETED)
            if not ended.done():   # the coordinator is gone: so is the job
                self._kill_child()
            # the host's processes are gone: the job ends here for this host
            status = await ended
            return 128 - status if status < 0 else status
        finally:
            link.cancel()
            await stopped_processes.freeze(self.thawed)  # the checkpoint is over
            # ckpt-remote's lock next to the socket (native/remote/host_agent.c)
            Path(self.local.socket_path + ".lock").unlink(missing_ok=True)
            await self.local.close()
            for task in list(self._tasks):
                task.cancel()

    async def _serve_link(self):
        while line := await self.reader.readline():
            self._handle(*split_line(line))

    async def _connect(self):
        host, _, port = self.address.rpartition(":")
        try:
            self.reader, self.writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port), limit=16 * self.line_max), CONNECT_TIMEOUT)
            await auth.client_handshake_async(self.reader, self.writer, self.secret)
        except (OSError, asyncio.TimeoutError, ValueError) as exc:
            raise CkptError(f"cannot reach the coordinator at {self.address}: {exc}")
        except auth.AuthError as exc:
            raise CkptError(f"coordinator at {self.address}: {exc}")
        self._send(f"AGENT {self.host} {self.protocol_version}")
        word, rest = split_line(await self.reader.readline())
        if word != "WELCOME":
            raise CkptError(f"coordinator at {self.address} refused the agent: {rest or 'closed'}")

    def _send(self, line):
        self.writer.write(line.encode() + b"\n")

    def _spawn(self, coro):
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- the host's processes --------------------------------------------

    async def _joined(self, proc):
        self._next_tag += 1
        proc.tag = str(self._next_tag)
        self.procs[proc.tag] = proc
        self._send(f"JOIN {proc.tag} {proc.pid} {int(proc.restored)} {proc.host} {proc.real_pid}")

    async def _left(self, proc):
        proc.wake()
        if self.procs.pop(proc.tag, None) is not None:
            self._send(f"LEAVE {proc.tag}")

    def _warned(self, proc, message):
        self._send(f"WARN {proc.tag} {escape(message)}")

    async def _name_service(self, word, rest):
        self._next_request += 1
        ident = self._next_request
        future = asyncio.get_running_loop().create_future()
        self._requests[ident] = future
        try:
            self._send(f"NS {ident} {word} {rest}".rstrip())
            return await future
        finally:
            self._requests.pop(ident, None)

    # ---- the coordinator -------------------------------------------------

    def _handle(self, word, rest):
        if word == "BARRIER":   # BARRIER id timeout tags PHASE name seq [arg]
            ident, timeout, tags, line = rest.split(" ", 3)
            self._spawn(self._barrier(ident, float(timeout), tags.split(","), line))
        elif word == "NSR":     # NSR id answer
            ident, _, answer = rest.partition(" ")
            future = self._requests.get(int(ident))
            if future is not None and not future.done():
                future.set_result(answer)
        elif word == "SIGNAL":
            self._signal(int(rest))
        elif word == "STOPPED":  # STOPPED id tags
            ident, _, tags = rest.partition(" ")
            self._spawn(self._answer(ident, self._find_stopped(tags.split(","))))
        elif word == "THAW":    # THAW id tags
            ident, _, tags = rest.partition(" ")
            self._spawn(self._answer(ident, self._thaw(tags.split(","))))
        elif word == "FREEZE-APP":
            self._spawn(self._answer(ident=rest, work=stopped_processes.freeze_app(self.thawed)))
        elif word == "FREEZE":
            self._spawn(self._answer(ident=rest, work=self._freeze()))
        elif word in verify.AGENT_WORDS:  # FINGERPRINT|VERIFY id tags path
            ident, _, args = rest.partition(" ")
            self._spawn(self._answer(ident, verify.on_agent(self, word, args)))

    async def _barrier(self, ident, timeout, tags, line):
        """One barrier over the host's processes named by tags; one answer."""
        _word, phase, seq, *arg = line.split(" ", 3)
        procs = [self.procs[t] for t in tags if t in self.procs]
        answer = {"fail": None}
        try:
            done, _gone = await barrier(phase, procs, timeout=timeout,
                                        arg=arg[0] if arg else None, seq=int(seq))
            self._check_images(phase, int(seq), arg, done)
            if len(done) == len(procs) and not any(done.values()):
                answer["all"] = True   # every one, nothing to say: the usual case
            else:
                answer["done"] = {proc.tag: keys for proc, keys in done.items()}
        except PhaseError as exc:
            answer["fail"] = f"{exc} (on {self.host})"
        self._send(f"ANSWERS {ident} {json.dumps(answer, separators=(',', ':'))}")

    def _check_images(self, phase, seq, arg, done):
        """The images this host's processes report complete (WRITE in
        place, SYNC) are in the checkpoint directory with their sizes:
        checked here, so the coordinator looks at no file of this host."""
        if phase == "WRITE":
            self.checkpoint_dir = {seq: unescape(arg[0].split(" ", 1)[0])}
        if phase in ("WRITE", "SYNC") and seq in self.checkpoint_dir:
            image_check.check(self.checkpoint_dir[seq], done, lambda proc: proc.describe())

    # ---- stopped processes: only this host can thaw them (/proc, ptrace) --

    async def _find_stopped(self, tags):
        found = await stopped_processes.find([self.procs[t] for t in tags if t in self.procs])
        return {"stopped": [proc.tag for proc in found]}

    async def _thaw(self, tags):
        await self._freeze()   # an earlier checkpoint's, had its FREEZE been lost
        self.thawed = await stopped_processes.thaw(
            [self.procs[t] for t in tags if t in self.procs])
        return {"stopped": [proc.tag for t in self.thawed for proc in t.procs]}

    async def _freeze(self):
        thawed, self.thawed = self.thawed, []
        await stopped_processes.freeze(thawed)

    async def _answer(self, ident, work):
        """ANSWERS <id> {..., "fail": null} once work is done, or its failure."""
        try:
            answer = dict(await work or {}, fail=None)
        except (PhaseError, OSError) as exc:
            answer = {"fail": f"{exc} (on {self.host})"}
        self._send(f"ANSWERS {ident} {json.dumps(answer, separators=(',', ':'))}")

    def _signal(self, signum):
        for proc in list(self.procs.values()):
            try:
                os.kill(proc.real_pid, signum)
            except OSError:
                pass
        if signum == signal.SIGKILL:
            self._kill_child()   # a restart not done yet: its processes with it

    def _kill_child(self):
        if self.child is not None:
            try:
                os.kill(self.child, signal.SIGKILL)  # not reaped yet: still its pid
            except ProcessLookupError:
                pass


async def child_exit(pid):
    """The exit status (negative: its signal) of a child this process did
    not start itself (`--adopt`: the shell that became it did), through a
    pidfd."""
    loop = asyncio.get_running_loop()
    pidfd = os.pidfd_open(pid)
    try:
        exited = loop.create_future()
        loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
    finally:
        os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def run_from_environment(command=(), environ=None, adopted=None):
    """`ckpt agent [--run -- COMMAND | --adopt PID]`: everything it needs is
    in the job's CKPT_* variables.  Returns the command's exit status."""
    environ = os.environ if environ is None else environ
    try:
        socket_path = environ["CKPT_COORD"]
        address = environ["CKPT_COORD_TCP"]
        secret_file = environ["CKPT_SECRET_FILE"]
        job_id = environ["CKPT_JOB_ID"]
    except KeyError as exc:
        raise CkptError(f"ckpt agent runs for ckpt-remote only ({exc.args[0]} is not set)")
    try:
        secret = auth.load_secret(secret_file)
    except (OSError, auth.AuthError) as exc:
        raise CkptError(f"cannot read the job's secret: {getattr(exc, 'strerror', None) or exc}")
    Path(socket_path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    serving = command or adopted is not None
    if not serving:  # detached: the ssh session that started us ends
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    agent = HostAgent(job_id=job_id, socket_path=socket_path, address=address, secret=secret)
    status = asyncio.run(agent.run(command, adopted))
    if not serving:
        print(f"ckpt agent {job_id} on {agent.host}: the coordinator closed the connection",
              file=sys.stderr)
    return status
