"""What launch and restart share: a registered coordinator, foreground
children reaped as a child subreaper, and signals forwarded to the job."""

import asyncio
import ctypes
import dataclasses
import os
import signal
import subprocess
import sys

from ckpt import auth, paths
from ckpt.coordinator import Coordinator
from ckpt.errors import CkptError
from ckpt.jobs import (JobEntry, process_start_time, refuse_if_running, rewrite,
                       socket_path_for, state_dir, this_host, unregister)
from ckpt.native import cli_path

PR_SET_CHILD_SUBREAPER = 36
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def become_subreaper():
    """Orphaned processes of the job are re-parented to us, not to init."""
    libc = ctypes.CDLL(None, use_errno=True)
    # a failure is not fatal: only the reaping of orphans depends on it
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def exit_code(wait_status):
    """Shell convention: the exit status, or 128+N when killed by signal N."""
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code


def _terminal_foreground_is_ours():
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def _one_line_exception(loop, context):
    """asyncio's last-resort report, as one line instead of a traceback."""
    if os.environ.get("CKPT_DEBUG"):
        loop.default_exception_handler(context)
        return
    exc = context.get("exception")
    if isinstance(exc, asyncio.CancelledError):
        return  # a connection cut short by the end of the job
    what = f"{type(exc).__name__}: {exc}" if exc else context.get("message", "?")
    print(f"ckpt: warning: internal: {what}", file=sys.stderr)


class JobSession:
    """One running job: coordinator, state-dir entry, children and signals."""

    def __init__(self, *, job_id, job_dir, command, config, restarted_from=None):
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.directory = state_dir()
        self.socket_path = socket_path_for(os.getpid(), self.directory)
        self.secret_file = paths.secret_file(job_dir, this_host(), os.getpid())
        self.coordinator = Coordinator(
            job_id=job_id, socket_path=self.socket_path, job_dir=job_dir, command=command,
            write_mode=config.write_mode(), barrier_timeout=config.barrier_timeout,
            keep=config.keep, restarted_from=restarted_from, on_kill=self.kill_children)
        self.entry = JobEntry(job_id=job_id, socket=self.socket_path, launcher_pid=os.getpid(),
                              command=list(command), job_dir=str(job_dir),
                              restarted_from=str(restarted_from or ""),
                              launcher_start=process_start_time(os.getpid()),
                              host=this_host(), secret_file=str(self.secret_file))
        self.children = []          # pids we started, in order
        self.exits = {}             # pid -> future of its exit code
        self.signal_targets = lambda: self.children[:1]
        self.finishing = []         # coroutine functions run before the session ends
        self.outlive_command = True  # False: the job ends with its command (a batch job)
        self._periodic = None

    async def __aenter__(self):
        self.loop.set_exception_handler(_one_line_exception)
        become_subreaper()
        self.loop.add_signal_handler(signal.SIGCHLD, self._reap)
        for signum in FORWARDED_SIGNALS:
            self.loop.add_signal_handler(signum, self._forward, signum)
        refuse_if_running(self.entry.job_id, self.directory)
        # the job runs nowhere else: a secret left in its directory is a
        # killed launcher's (its name may even be ours: pids repeat)
        remove_stale_secrets(self.coordinator.job_dir)
        self.coordinator.secret = _create_secret(self.secret_file)
        try:
            await self.coordinator.start()
            self.entry.address = f"{self.entry.host}:{self.coordinator.tcp_port}"
            rewrite(self.entry, self.directory)
        except BaseException:
            await self.coordinator.close()
            _remove(self.secret_file)
            raise
        return self

    async def __aexit__(self, *exc):
        for finish in self.finishing:
            await finish()
        self.stop_periodic()
        unregister(self.entry, self.directory)
        await self.coordinator.close()
        _remove(self.secret_file)
        for signum in FORWARDED_SIGNALS + (signal.SIGCHLD,):
            self.loop.remove_signal_handler(signum)
        return False

    def environment(self, base=None):
        """What the job's processes need to join it, on this host or any
        other (ckpt-remote hands these on): never the secret itself."""
        env = dict(os.environ if base is None else base)
        env.update(CKPT_COORD=self.socket_path, CKPT_JOB_ID=self.entry.job_id,
                   CKPT_COORD_TCP=self.entry.address, CKPT_SECRET_FILE=str(self.secret_file),
                   CKPT_AGENT=str(cli_path()))
        return env

    def start_periodic(self):
        if self.config.interval > 0:
            self._periodic = asyncio.ensure_future(self.coordinator.periodic(self.config.interval))

    def stop_periodic(self):
        """No periodic checkpoint from now on (one under way goes on)."""
        if self._periodic is not None:
            self._periodic.cancel()
            self._periodic = None
        self.coordinator.next_checkpoint_at = None  # `ckpt status`: none due

    def spawn(self, argv, env):
        """Start a foreground child sharing our stdin/stdout/stderr."""
        try:
            child = subprocess.Popen(argv, env=env, close_fds=False, restore_signals=True)
        except OSError as exc:
            raise CkptError(f"cannot execute {argv[0]!r}: {exc.strerror}")
        self.children.append(child.pid)
        self.exits.setdefault(child.pid, self.loop.create_future())
        child.returncode = 0  # we reap it ourselves; keep Popen from waiting
        self._reap()
        return child.pid

    def _reap(self):
        """Collect every dead child, ours or an adopted orphan."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            future = self.exits.setdefault(pid, self.loop.create_future())
            if not future.done():
                future.set_result(exit_code(status))

    def _forward(self, signum):
        for pid in self.signal_targets():
            if signum == signal.SIGINT and self._already_got_terminal_signal(pid):
                continue
            try:
                os.kill(pid, signum)
            except OSError:
                pass

    def _already_got_terminal_signal(self, pid):
        """^C reaches the whole foreground process group; don't send it twice."""
        try:
            return os.getpgid(pid) == os.getpgrp() and _terminal_foreground_is_ours()
        except OSError:
            return False

    def kill_children(self):
        for pid in self.children:
            if not self.exits[pid].done():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    async def wait_exit(self, pid):
        # shielded: a cancelled waiter must not cancel the shared exit future
        return await asyncio.shield(self.exits[pid])

    async def lives_on(self, what, status, ended_pid=None):
        """`what` (the command, the restored root) ended with `status`.  The
        job lives as long as any of its processes: if some still run, say
        which, and go on without the launcher (unless the job must end with
        its command: then they are killed).  Returns the status."""
        left = [] if self.coordinator.killed.is_set() else await self.still_running(ended_pid)
        if not left:
            return status
        if not self.outlive_command:
            self.coordinator.kill()
            return status
        job_id = self.entry.job_id
        pids = ", ".join(str(p.real_pid) for p in left[:8]) + (", ..." if len(left) > 8 else "")
        print(f"ckpt: job {job_id}: {what} exited with status {status}; {len(left)} of the "
              f"job's processes still run ({pids}): the job goes on until they end "
              f"(ckpt checkpoint|kill {job_id}; messages in "
              f"{paths.coordinator_log(self.coordinator.job_dir)})", file=sys.stderr)
        return await self.go_on_without_launcher(status)

    async def still_running(self, ended_pid, settle=1.0, hello_wait=5.0):
        """The job's processes that still run once ended_pid is gone (its
        children that ended with it have `settle` seconds to leave; a
        process of ours that has not said HELLO yet, a daemon forked just
        before, has `hello_wait` seconds to)."""
        now = self.loop.time()
        deadline, hello_deadline = now + settle, now + hello_wait
        while True:
            # other hosts' processes: registered is running
            left = [p for p in self.coordinator.live_processes()
                    if p.agent is not None or (p.real_pid != ended_pid and _running(p.real_pid))]
            waiting_hello = not left and self.loop.time() < hello_deadline and \
                any(pid != ended_pid for pid in _live_children())
            if not waiting_hello and (not left or self.loop.time() > deadline):
                return left
            await asyncio.sleep(0.05)

    async def go_on_without_launcher(self, status):
        """The command ended but processes of the job still run: the
        launcher exits now with the command's status, and the coordinator
        goes on in a process of its own (a new session, its messages in
        the job's coordinator.log) until the last process of the job ends
        or `ckpt kill`."""
        log = paths.coordinator_log(self.coordinator.job_dir)
        log.parent.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() != 0:
            os._exit(status)
        # the loop runs on in this child: asyncio keys the running loop by
        # pid, and adding a signal handler sets the loop's wakeup fd again
        asyncio._set_running_loop(self.loop)
        self.loop.add_signal_handler(signal.SIGCHLD, self._reap)
        os.setsid()
        become_subreaper()
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(null)
        self.entry = dataclasses.replace(self.entry, launcher_pid=os.getpid(),
                                         launcher_start=process_start_time(os.getpid()))
        rewrite(self.entry, self.directory)
        self.signal_targets = lambda: []
        await self.coordinator.wait_until_empty()
        return status


def remove_stale_secrets(job_dir):
    """Every coordinator's secret in job_dir: for a job that runs
    nowhere, they are all stale."""
    try:
        stale = paths.secret_files(job_dir)
    except OSError:
        return
    for path in stale:
        _remove(path)


def _create_secret(path):
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return auth.create_secret_file(path)
    except OSError as exc:
        raise CkptError(f"cannot create the job's secret in {path.parent}: {exc.strerror}")


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _live_children():
    """Our children that run: as a subreaper, the job's orphans too."""
    pids = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as children:
                pids.update(int(pid) for pid in children.read().split())
        except OSError:
            continue
    return [pid for pid in pids if _running(pid)]


def _running(pid):
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def announce(job_id):
    print(f"ckpt: job {job_id}", file=sys.stderr, flush=True)
