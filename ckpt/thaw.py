"""A stopped process (SIGSTOP, ^Z) taken through a checkpoint without its
parent or itself seeing it run.

Its checkpoint thread is stopped with the rest, so the coordinator runs
this helper as a ptrace tracer (`python3 -m ckpt.thaw PID`, one per stopped
process; a process of its own, so that the coordinator's own waitpid(-1)
never takes the tracees' stops).  PTRACE_SEIZE on every thread keeps the
group stop; only the checkpoint thread is let go, and each other thread
only to take the parking signal, which it handles before any application
code.  Detaching a thread while the group stop is in effect puts it back
into the stop (the kernel's __ptrace_unlink), without a new notification
to the parent: the parent waits for, and is told of, exactly what it was
before.

Commands on stdin, one answer line each on stdout:
  (start)       -> "thawed"                 every thread seized, the checkpoint thread runs
  freeze-app    -> "ok"                     the application's threads are stopped again
  freeze-ckpt   -> "ok", exit               so is the checkpoint thread
Errors: "error <message>", exit.  EOF on stdin freezes everything.
"""
import ctypes
import os
import select
import sys
import time

PTRACE_CONT = 7
PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
WALL = 0x40000000
PARKING_SIGNAL = 33
CHECKPOINT_THREAD_NAME = "ckpt"
POLL_SECONDS = 0.005
REFREEZE_SECONDS = 10.0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


class ThawError(Exception):
    pass


def ptrace(request, tid, data=0):
    if _libc.ptrace(request, tid, None, ctypes.c_void_p(data)) == -1:
        err = ctypes.get_errno()
        raise ThawError(f"ptrace {request:#x} on thread {tid}: {os.strerror(err)}")


def threads(pid):
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


def thread_name(pid, tid):
    with open(f"/proc/{pid}/task/{tid}/comm") as f:
        return f.read().strip()


def pending_signals(pid, tid):
    """The thread's own pending signals (SigPnd), as a bit mask."""
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        for line in f:
            if line.startswith("SigPnd:"):
                return int(line.split()[1], 16)
    return 0


def thread_state(pid, tid):
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"  # gone


def wait_group_stopped(pid, tids):
    """A detached thread runs a moment to enter the group stop again
    (it shows 'R' meanwhile): wait until it has, so that nobody is told
    its stopped process runs again, such as a parent reading its state."""
    deadline = time.monotonic() + REFREEZE_SECONDS
    for tid in tids:
        while thread_state(pid, tid) not in ("T", "X", "Z"):
            if time.monotonic() > deadline:
                raise ThawError(f"thread {tid} did not stop again")
            time.sleep(0.001)


def wait_stop(tid):
    """The signal of tid's next stop (ptrace stops only: it lives on)."""
    _, status = os.waitpid(tid, WALL)
    if not os.WIFSTOPPED(status):
        raise ThawError(f"thread {tid} ended during the checkpoint")
    return os.WSTOPSIG(status)


class Thaw:
    def __init__(self, pid):
        self.pid = pid
        self.seized = []
        self.released = set()   # application threads sent through the parking signal
        self.checkpointer = None

    def start(self):
        for tid in threads(self.pid):
            ptrace(PTRACE_SEIZE, tid)
            self.seized.append(tid)
        for tid in self.seized:
            wait_stop(tid)      # the group stop, now a ptrace stop
        names = {tid: thread_name(self.pid, tid) for tid in self.seized}
        found = [tid for tid, name in names.items() if name == CHECKPOINT_THREAD_NAME]
        if not found:
            raise ThawError(f"process {self.pid} has no checkpoint thread")
        self.checkpointer = found[0]
        ptrace(PTRACE_CONT, self.checkpointer)

    def release_parked(self):
        """Each application thread with the parking signal pending goes
        into its handler (delivery is a ptrace stop: the signal is given
        back with PTRACE_CONT)."""
        bit = 1 << (PARKING_SIGNAL - 1)
        for tid in self.seized:
            if tid == self.checkpointer or tid in self.released:
                continue
            if pending_signals(self.pid, tid) & bit:
                ptrace(PTRACE_CONT, tid)
                sig = wait_stop(tid)
                ptrace(PTRACE_CONT, tid, sig)
                self.released.add(tid)

    def freeze(self, tid):
        """Back into the group stop: detach from a ptrace stop."""
        if tid in self.released or tid == self.checkpointer:
            ptrace(PTRACE_INTERRUPT, tid)
            wait_stop(tid)
        ptrace(PTRACE_DETACH, tid)

    def freeze_app(self):
        app = [tid for tid in self.seized if tid != self.checkpointer]
        for tid in app:
            self.freeze(tid)
        wait_group_stopped(self.pid, app)
        self.seized = [self.checkpointer]


def answer(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(pid):
    thaw = Thaw(pid)
    try:
        thaw.start()
        answer("thawed")
        while True:
            ready, _, _ = select.select([sys.stdin], [], [], POLL_SECONDS)
            if not ready:
                thaw.release_parked()
                continue
            command = sys.stdin.readline().strip()
            if command == "freeze-app":
                thaw.freeze_app()
                answer("ok")
            elif command in ("freeze-ckpt", ""):   # "": EOF, freeze all
                if command == "":
                    thaw.freeze_app()
                thaw.freeze(thaw.checkpointer)
                wait_group_stopped(pid, [thaw.checkpointer])
                answer("ok")
                return 0
    except (ThawError, OSError) as exc:
        answer(f"error {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
