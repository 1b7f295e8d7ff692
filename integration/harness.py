"""Drives real jobs through the ckpt CLI for the end-to-end tests.

Every test program under integration/apps does deterministic, paced work,
prints READY once set up, and ends with "RESULT <value>" and PASS after
checking its own state.  Its stdout goes to a file: a restarted process
reopens that file at the checkpointed offset, so after a correct restart
the file equals the output of an uninterrupted run, byte for byte.
"""
import ctypes
import json
import os
import re
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
APPS = REPO / "integration" / "apps" / "bin"
PR_SET_CHILD_SUBREAPER = 36
SYSTEM_PYTHON = "/usr/bin/python3"


def become_subreaper():
    """Orphaned job processes are reparented to us, not to a slow PID 1."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_orphans():
    """Reap ended children that nobody waits for, but not an uninterrupted
    reference run still going beside a job (its status is waited for)."""
    running = {proc.pid for proc, _ in REFERENCES_RUNNING.values()}
    for child in psutil.Process().children():
        if child.pid in running:
            continue
        try:
            os.waitpid(child.pid, os.WNOHANG)
        except ChildProcessError:
            pass


@dataclass
class User:
    """Who runs the ckpt commands: the current user, or an unprivileged uid."""
    uid: int = os.getuid()
    home: Path = None

    @property
    def unprivileged(self):
        return self.uid != 0

    def wrap(self, argv):
        if self.uid == os.getuid():
            return argv
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}",
                "--clear-groups", "--"] + argv

    def python(self):
        # root's pyenv is not reachable by other users: use Debian's python
        return sys.executable if self.uid == os.getuid() else SYSTEM_PYTHON


@dataclass
class Session:
    """One test's world: its own state dir, checkpoint dir and outputs."""
    root: Path
    user: User = field(default_factory=User)
    rng: random.Random = field(default_factory=random.Random)
    extra_env: dict = field(default_factory=dict)  # e.g. softverbs for verbs jobs

    def __post_init__(self):
        self.root.mkdir(parents=True, exist_ok=True)
        # the job registry and coordinator sockets: a short path of the
        # session's own (under pytest-xdist a tmp path can be too long for
        # a socket's name, and ckpt then shares /tmp/ckpt-<uid> with the
        # other worker's sessions, whose `ckpt list` and `kill` see its jobs)
        self.state = Path(tempfile.mkdtemp(prefix="ckrt-", dir="/tmp"))
        self.images = self.root / "images"
        self.work = self.root / "work"
        for d in (self.state, self.images, self.work):
            d.mkdir(parents=True, exist_ok=True)
            if self.user.uid != os.getuid():
                os.chown(d, self.user.uid, self.user.uid)
        if self.user.uid != os.getuid():
            os.chown(self.root, self.user.uid, self.user.uid)

    def end(self):
        """Kill what the test's jobs left running (a test that failed
        before its kill): orphaned MPI ranks would spin on for good."""
        listed = self.ckpt("list", check=False, timeout=60)
        for line in listed.stdout.splitlines():
            job_id = line.split("\t")[0].strip()
            if job_id:
                self.ckpt("kill", job_id, check=False, timeout=60)
        reap_orphans()
        shutil.rmtree(self.state, ignore_errors=True)

    def env(self):
        env = dict(os.environ)
        env["XDG_RUNTIME_DIR"] = str(self.state)
        env["HOME"] = str(self.root)
        env["CKPT_CONFIG"] = str(self.root / "no-config.yaml")
        env["PYTHONPATH"] = str(REPO)
        env.pop("LD_PRELOAD", None)
        env.update(self.extra_env)
        return env

    def ckpt_argv(self, *args):
        return self.user.wrap([self.user.python(), "-m", "ckpt", *map(str, args)])

    def ckpt(self, *args, check=True, timeout=120):
        proc = subprocess.run(self.ckpt_argv(*args), cwd=self.work, env=self.env(),
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"ckpt {' '.join(map(str, args))} failed "
                                 f"({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def reference(self, app, *args):
        """The output of an uninterrupted run, without ckpt.  The programs'
        output is the same on every run (they check that themselves), so
        each command runs once per test run: several tests compare with it."""
        key = self.start_reference(app, *args)
        if key in REFERENCES_RUNNING:
            proc, out = REFERENCES_RUNNING[key]
            rc = proc.wait(timeout=300)
            del REFERENCES_RUNNING[key]
            assert rc == 0, f"{app} failed without ckpt: {out.read_text()}"
            REFERENCES[key] = out.read_text()
        return REFERENCES[key]

    def start_reference(self, app, *args):
        """Start the uninterrupted run now, to run beside the test's job (the
        test programs mostly sleep between steps), in a directory of its own
        so that the files they make in "." do not meet the job's."""
        argv = self.user.wrap(command(app, *args))
        key = (tuple(argv), tuple(sorted(self.extra_env.items())))
        if key in REFERENCES or key in REFERENCES_RUNNING:
            return key
        where = Path(tempfile.mkdtemp(prefix="reference-", dir=self.work))
        if self.user.uid != os.getuid():
            os.chown(where, self.user.uid, self.user.uid)
        out = where / "stdout"
        with open(out, "w") as stdout:
            proc = subprocess.Popen(argv, cwd=where, env=self.env(), stdout=stdout,
                                    stderr=subprocess.DEVNULL)
        REFERENCES_RUNNING[key] = (proc, out)
        return key


REFERENCES = {}  # (command, extra environment) -> output
REFERENCES_RUNNING = {}  # the same key -> (Popen, its stdout file), not yet waited for


def command(app, *args):
    """A test program by name, or a whole command line (mpirun ...)."""
    head = [str(APPS / app)] if isinstance(app, str) else [str(a) for a in app]
    return head + [str(a) for a in args]


class Job:
    """A job launched with `ckpt launch`, its stdout in a file."""

    def __init__(self, session, job_id, app, *args, prefix=(), launch_args=(),
                 stderr_file=False):
        """stderr_file: the launcher's stderr in a file, not a pipe (a job
        that outlives its launcher holds on to it)."""
        self.s = session
        self.id = job_id
        self.out = session.work / f"{job_id}.out"
        self.err = session.work / f"{job_id}.err"
        # a test program waits after its steps (zdtm_hold()) until kill()
        # or wait() removes this, so that checkpoints never outrun it
        self.hold = session.work / f"{job_id}.hold"
        self.hold.touch()
        self.images = []
        with open(self.out, "w") as out, open(self.err, "w") as err:
            if session.user.uid != os.getuid():
                os.chown(self.out, session.user.uid, session.user.uid)
            self.proc = subprocess.Popen(
                [*prefix] + session.ckpt_argv("launch", "--job-id", job_id, "--ckpt-dir",
                                  session.images, *launch_args, "--", *command(app, *args)),
                cwd=session.work, env={**session.env(), "ZDTM_HOLD": str(self.hold)},
                stdout=out, stderr=err if stderr_file else subprocess.PIPE, text=True)

    def _how_it_ended(self):
        """What the job said if it is gone: a job that ended on its own
        (outran the test) reads differently from one that crashed."""
        if self.proc.poll() is None:
            return ""
        err = self.err.read_text() if self.proc.stderr is None else self.proc.stderr.read()
        tail = " | ".join(self.output().strip().splitlines()[-2:])
        return (f"; the job had ended with status {self.proc.returncode}, "
                f"output ending {tail!r}, stderr {err.strip()[-400:]!r}")

    def stderr_text(self):
        return self.err.read_text()

    def output(self):
        return self.out.read_text()

    def wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        # a whole line: a program may write its READY line in pieces
        while not re.search(r"READY[^\n]*\n", self.output()):
            if self.proc.poll() is not None:
                raise AssertionError(f"job {self.id} ended before READY: "
                                     f"{self.proc.stderr.read()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"job {self.id} never became READY")
            time.sleep(0.02)

    def checkpoint(self, *extra):
        proc = self.s.ckpt("checkpoint", self.id, *extra, check=False)
        if proc.returncode != 0:
            raise AssertionError(f"ckpt checkpoint {self.id} failed ({proc.returncode}): "
                                 f"{proc.stderr.strip()}{self._how_it_ended()}")
        path = Path(proc.stdout.strip().splitlines()[-1])
        assert path.is_dir(), f"checkpoint printed {path}, not a directory"
        self.images.append(path)
        return path

    def checkpoint_at_random_moments(self, count, low=0.05, high=0.4, *extra):
        for _ in range(count):
            time.sleep(self.s.rng.uniform(low, high))
            self.checkpoint(*extra)

    def restart_held(self, image):
        """A restart of one of this job's images that holds at its end, as
        the launched job did, until kill(): a chain checkpoints it again."""
        self.hold.touch()
        restarted = Restart(self.s, image)
        restarted.wait_registered(self.id)
        return restarted

    def kill(self):
        killed = self.s.ckpt("kill", self.id, check=False)
        if killed.returncode != 0:  # a job that ended: its own FAIL line says why
            raise AssertionError(f"ckpt kill {self.id} failed ({killed.returncode}): "
                                 f"{killed.stderr.strip()}; output ends "
                                 f"{self.output()[-500:]!r}")
        rc = self.proc.wait(timeout=60)
        reap_orphans()
        self.hold.unlink(missing_ok=True)  # restarted programs run to their end
        return rc

    def wait(self, timeout=300):
        self.hold.unlink(missing_ok=True)
        rc = self.proc.wait(timeout=timeout)
        reap_orphans()
        return rc


class Restart:
    """A job restarted with `ckpt restart`; its processes write where they did."""

    def __init__(self, session, image_dir, *options):
        self.s = session
        self.proc = subprocess.Popen(session.ckpt_argv("restart", image_dir, *options),
                                     cwd=session.work, env=session.env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)

    def wait_registered(self, job_id, timeout=60):
        """Until the restarted job answers `ckpt status` (its coordinator
        is up and registered), so that a checkpoint finds it."""
        deadline = time.monotonic() + timeout
        while self.s.ckpt("status", job_id, check=False, timeout=30).returncode != 0:
            assert self.proc.poll() is None, f"restart of {job_id} ended: {self.proc.stderr.read()}"
            assert time.monotonic() < deadline, f"restart of {job_id} never registered"
            time.sleep(0.05)

    def wait(self, timeout=300):
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # a hung restart must not outlive the test: it and what it restored
            import psutil
            for proc in psutil.Process(self.proc.pid).children(recursive=True) + \
                    [psutil.Process(self.proc.pid)]:
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
            self.proc.communicate()
            reap_orphans()
            raise
        reap_orphans()
        self.stdout, self.stderr = out, err
        return self.proc.returncode


def restart_and_finish(session, image_dir, job):
    """Restart from image_dir, let it run to its end, return the job's output."""
    job.hold.unlink(missing_ok=True)
    r = Restart(session, image_dir)
    rc = r.wait()
    # the program's own FAIL lines say what went wrong
    assert rc == 0, (f"restart of {image_dir} exited {rc}: {r.stderr.strip()}\n"
                     f"output ends: {job.output()[-500:]}")
    return job.output()


def checkpoint_kill_restart(session, job_id, app, args, low=0.2, high=0.6):
    """Three checkpoints at random moments, kill, restart from one of them
    at random: the output must equal an uninterrupted run's."""
    reference = session.reference(app, *args)
    assert "PASS" in reference
    job = Job(session, job_id, app, *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(3, low, high)
    job.kill()
    image = session.rng.choice(job.images)
    assert restart_and_finish(session, image, job) == reference, \
        f"{job_id} restarted from {image.name} differs"


def clean(path):
    shutil.rmtree(path, ignore_errors=True)


class Pause:
    """CKPT_PAUSE_BEFORE (ckpt/pause.py) for one phase: a checkpoint or
    restart held before it, armed, waited for, let go."""

    def __init__(self, session, phase):
        self.path = session.root / "paused"
        self.env = {"CKPT_PAUSE_BEFORE": f"{phase}:{self.path}"}

    def arm(self):
        self.path.with_name("paused.arm").touch()

    def wait(self, *watched, timeout=60):
        deadline = time.monotonic() + timeout
        while not self.path.exists():
            for proc in watched:
                assert proc.poll() is None, f"ended before the pause: {proc.args}"
            assert time.monotonic() < deadline, "the pause point was never reached"
            time.sleep(0.01)
        return json.loads(self.path.read_text())

    def release(self):
        self.path.unlink(missing_ok=True)

    def disarm(self):
        self.path.with_name("paused.arm").unlink(missing_ok=True)
        self.release()
