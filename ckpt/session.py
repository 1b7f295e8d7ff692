"""What launch and restart share: a registered coordinator, foreground
children reaped as a child subreaper, and signals forwarded to the job."""

import asyncio
import ctypes
import os
import signal
import subprocess
import sys

from ckpt.coordinator import Coordinator
from ckpt.errors import CkptError
from ckpt.jobs import JobEntry, process_start_time, register, socket_path_for, state_dir, unregister

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
        self.coordinator = Coordinator(
            job_id=job_id, socket_path=self.socket_path, job_dir=job_dir, command=command,
            barrier_timeout=config.barrier_timeout, keep=config.keep,
            restarted_from=restarted_from, on_kill=self.kill_children,
            forked_write=config.forked_write)
        self.entry = JobEntry(job_id=job_id, socket=self.socket_path, launcher_pid=os.getpid(),
                              command=list(command), ckpt_dir=str(job_dir),
                              restarted_from=str(restarted_from or ""),
                              launcher_start=process_start_time(os.getpid()))
        self.children = []          # pids we started, in order
        self.exits = {}             # pid -> future of its exit code
        self.signal_targets = lambda: self.children[:1]
        self._periodic = None

    async def __aenter__(self):
        self.loop.set_exception_handler(_one_line_exception)
        become_subreaper()
        self.loop.add_signal_handler(signal.SIGCHLD, self._reap)
        for signum in FORWARDED_SIGNALS:
            self.loop.add_signal_handler(signum, self._forward, signum)
        await self.coordinator.start()
        try:
            register(self.entry, self.directory)
        except BaseException:
            await self.coordinator.close()
            raise
        return self

    async def __aexit__(self, *exc):
        if self._periodic is not None:
            self._periodic.cancel()
        unregister(self.entry, self.directory)
        await self.coordinator.close()
        for signum in FORWARDED_SIGNALS + (signal.SIGCHLD,):
            self.loop.remove_signal_handler(signum)
        return False

    def start_periodic(self):
        if self.config.interval > 0:
            self._periodic = asyncio.ensure_future(self.coordinator.periodic(self.config.interval))

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


def announce(job_id):
    print(f"ckpt: job {job_id}", file=sys.stderr, flush=True)
