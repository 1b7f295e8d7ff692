"""Faults at every phase: a real checkpoint (and a real restart) is held
between two of its phases (CKPT_PAUSE_BEFORE, ckpt/pause.py), a fault is
injected there, and the outcome is checked against the design:

  - rank: kill -9 of one process of the job (a leaf of proctree's tree);
  - coordinator: kill -9 of the process that runs it (`ckpt launch`, or
    `ckpt restart` for a restart);
  - client: kill -9 of `ckpt checkpoint` waiting for its answer;
  - full disk: the checkpoint directory's filesystem filled up.

After each: the job ran on to the result of an uninterrupted run, or
ended; no process of it is left; the previous checkpoint is intact and
restores to the exact result; a checkpoint published with the fault is
restored too when it was taken before the fault hit.  The outcomes make
docs/FAULTS.md (written by the last test, from what was seen)."""
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from ckpt.image import verify_checkpoint
from harness import REPO, Job, Pause, Restart, reap_orphans, restart_and_finish

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="mounts a small tmpfs per case (root)")

APP = ["proctree", "300", "6"]  # long enough for two checkpoints on a busy machine
CHECKPOINT_PHASES = ["STOP", "RELEASE", "SUSPEND", "DRAIN", "FLUSH", "WRITE", "RESUME", "SYNC",
                     "PUBLISH"]
RESTART_PHASES = ["REBUILD", "REFILL", "RESUME"]
FAULTS = ["rank", "coordinator", "client", "full disk"]
SUSPENDED_FROM = CHECKPOINT_PHASES.index("DRAIN")   # processes are parked from here
IMAGED_FROM = CHECKPOINT_PHASES.index("RESUME")     # every image is taken from here

RUNS_ON = "job runs on to the right result"
# the application sees its process die and ends: the checkpoint may find
# none of it left by the time it gets to suspend them
LEFT_OUT = "the killed process left out (abandoned when the whole job ended first)"
# the images of a forked write may all be on disk already, and the manifest
# fit in what a writer's scratch left free
SPACE_LATE = "abandoned (no space left), or published when all but the manifest was written"
ENDS = "job ends (its process was killed)"


def expected(phase, fault):
    """(what becomes of the checkpoint, what becomes of the job): the design."""
    at = CHECKPOINT_PHASES.index(phase)
    if fault == "rank":
        if at < SUSPENDED_FROM:
            return LEFT_OUT, ENDS
        if at < IMAGED_FROM:
            return "abandoned (a process died while suspended)", ENDS
        return "published, taken before the kill", ENDS
    if fault == "coordinator":
        return "abandoned (not published)", RUNS_ON
    if fault == "client":
        return "published", RUNS_ON
    if at < IMAGED_FROM:
        return "abandoned (no space left)", RUNS_ON
    return SPACE_LATE, RUNS_ON


OUTCOMES = {}   # (kind, phase, fault) -> (checkpoint, job), for docs/FAULTS.md
_REFERENCE = []


def _reference(session):
    """The uninterrupted run's output (the same for every case)."""
    if not _REFERENCE:
        _REFERENCE.append(session.reference(*APP))
    return _REFERENCE[0]


def _small_fs(session):
    fs = session.root / "fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", fs], check=True)
    return fs


def _fill(fs):
    """Every free byte of fs taken (fallocate, then small writes to the end)."""
    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        free = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize
        try:
            os.posix_fallocate(fd, 0, free)
        except OSError:
            pass
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
    finally:
        os.close(fd)


def _victim(held):
    """One process of the job, not its root: the newest."""
    return max(p["real_pid"] for p in held["processes"])


def _running(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # gone, maybe between two looks
        return False


def _wait_gone(pids, timeout=60):
    """Until none of pids is running (they are ours to reap once orphaned)."""
    deadline = time.monotonic() + timeout
    while True:
        reap_orphans()
        alive = [pid for pid in pids if _running(pid)]
        if not alive:
            return
        if time.monotonic() > deadline:
            for pid in alive:
                os.kill(pid, signal.SIGKILL)
            reap_orphans()
            raise AssertionError(f"processes {alive} of the job were left running")
        time.sleep(0.05)


def _forget_output_after_ready(job):
    """Both checkpoints are taken after READY, where the output file's
    offset is saved; what a run wrote past it (the FAIL lines of a job
    whose process was killed) a restart overwrites only as far as it
    writes itself: it does not truncate files."""
    with open(job.out, "r+") as out:
        out.truncate(len("READY\n"))


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("phase", CHECKPOINT_PHASES)
def test_fault_during_checkpoint(session, phase, fault):
    reference = _reference(session)
    fs = _small_fs(session)
    session.images = fs
    pause = Pause(session, phase)
    session.extra_env.update(pause.env)
    try:
        job = Job(session, "faulty", *APP)
        job.wait_ready()
        first = job.checkpoint()
        pause.arm()
        client = subprocess.Popen(session.ckpt_argv("checkpoint", job.id), cwd=session.work,
                                  env=session.env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        held = pause.wait(client, job.proc)
        job_pids = [p["real_pid"] for p in held["processes"]]
        if fault == "rank":
            os.kill(_victim(held), signal.SIGKILL)
        elif fault == "coordinator":
            os.kill(held["coordinator"], signal.SIGKILL)
        elif fault == "client":
            client.kill()
        else:
            _fill(fs)
        pause.release()

        _out, err = client.communicate(timeout=120)
        if fault != "client" and client.returncode != 0:
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        if fault == "coordinator":
            job.proc.wait(timeout=60)
            job.hold.unlink(missing_ok=True)
            _wait_gone(job_pids, timeout=120)   # they run on to their end, unwatched
            status = 0 if job.output() == reference else 1
        else:
            status = job.wait(timeout=120)
            _wait_gone(job_pids)
        (fs / "filler").unlink(missing_ok=True)

        job_dir = first.parent
        second = job_dir / "ckpt-0002"
        published = (job_dir / "latest").resolve() == second.resolve() and second.is_dir()
        # what `ckpt checkpoint` said agrees with what was published
        assert fault == "client" or (client.returncode == 0) == published, err
        if not published and fault == "rank" and ("every process of the job exited" in err or
                                                  "the job ended before" in err):
            what = LEFT_OUT
        elif not published and fault == "full disk":
            assert "No space left" in err, err
            at = CHECKPOINT_PHASES.index(phase)
            what = "abandoned (no space left)" if at < IMAGED_FROM else SPACE_LATE
        elif not published:
            what = {"rank": "abandoned (a process died while suspended)",
                    "coordinator": "abandoned (not published)"}.get(fault, "abandoned")
        elif fault == "rank" and CHECKPOINT_PHASES.index(phase) < SUSPENDED_FROM:
            pids = {p["pid"] for p in verify_checkpoint(second)["processes"]}
            assert len(pids) < len(job_pids), pids
            what = LEFT_OUT
        elif fault == "rank":
            what = "published, taken before the kill"
        elif fault == "full disk":
            what = SPACE_LATE
        else:
            what = "published"
        if status == 0:
            assert job.output() == reference
            fate = RUNS_ON
        else:
            fate = ENDS
        OUTCOMES[("checkpoint", phase, fault)] = (what, fate)
        assert (what, fate) == expected(phase, fault)

        # the previous checkpoint is whole, and so is one taken before the fault
        verify_checkpoint(first, checksum=True)
        if fault != "coordinator":
            assert not list(job_dir.glob(".ckpt-*")), "a half-written checkpoint was left behind"
        session.extra_env.pop("CKPT_PAUSE_BEFORE")
        _forget_output_after_ready(job)
        assert restart_and_finish(session, first, job) == reference
        if published and what != LEFT_OUT:
            _forget_output_after_ready(job)
            assert restart_and_finish(session, second, job) == reference
    finally:
        pause.disarm()
        reap_orphans()
        subprocess.run(["umount", "-l", fs])


@pytest.mark.parametrize("fault", ["rank", "coordinator"])
@pytest.mark.parametrize("phase", RESTART_PHASES)
def test_fault_during_restart(session, phase, fault):
    """A restart that loses a process or its coordinator before it is
    done ends, whole: nothing of it runs on half restored; the
    checkpoint restarts right afterwards."""
    reference = _reference(session)
    job = Job(session, "faulty", *APP)
    job.wait_ready()
    first = job.checkpoint("--kill")
    job.wait()
    pause = Pause(session, phase)
    session.extra_env.update(pause.env)
    pause.arm()
    restart = Restart(session, first)
    try:
        held = pause.wait(restart.proc)
        job_pids = [p["real_pid"] for p in held["processes"]]
        if fault == "rank":
            os.kill(_victim(held), signal.SIGKILL)
        else:
            os.kill(held["coordinator"], signal.SIGKILL)
        pause.release()
        rc = restart.wait(timeout=120)
        assert rc != 0
        if fault == "rank":
            # one error line (warnings, such as a verified restore's, are others)
            lines = [line for line in restart.stderr.strip().splitlines()
                     if not line.startswith("ckpt: warning:")]
            assert len(lines) == 1 and "Traceback" not in restart.stderr, restart.stderr
        _wait_gone(job_pids)
        OUTCOMES[("restart", phase, fault)] = (
            "the restart fails in one line" if fault == "rank" else
            "the restored processes end", "nothing of it is left")
    finally:
        pause.disarm()
        reap_orphans()
    session.extra_env.pop("CKPT_PAUSE_BEFORE")
    assert restart_and_finish(session, first, job) == reference


def test_fault_table_in_docs():
    """docs/FAULTS.md from the outcomes seen above (when the whole matrix ran)."""
    cases = len(CHECKPOINT_PHASES) * len(FAULTS) + len(RESTART_PHASES) * 2
    if len(OUTCOMES) != cases:
        pytest.skip(f"{len(OUTCOMES)} of {cases} fault cases ran here")
    lines = ["# Faults at every phase", "",
             "Produced by `integration/test_fault_matrix.py` (the README's test command): "
             "a real checkpoint or restart of a job (`proctree`: six processes) is held before "
             "the phase named on the left (`CKPT_PAUSE_BEFORE`, ckpt/pause.py), the fault is "
             "injected, and what follows is observed.  In every case no process of the job is "
             "left, the previous checkpoint stays intact and restarts to the exact result of an "
             "uninterrupted run, and a checkpoint published with the fault restarts to it too "
             "when it was taken before the fault.", "",
             "## Checkpoint", "",
             "| before | " + " | ".join(FAULTS) + " |",
             "|---|" + "---|" * len(FAULTS)]
    for phase in CHECKPOINT_PHASES:
        cells = ["; ".join(OUTCOMES[("checkpoint", phase, f)]) for f in FAULTS]
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    lines += ["", "## Restart", "",
              "| before | rank | coordinator (`ckpt restart`) |", "|---|---|---|"]
    for phase in RESTART_PHASES:
        cells = ["; ".join(OUTCOMES[("restart", phase, f)]) for f in ("rank", "coordinator")]
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    lines += ["", "Kill -9 of one rank: a process killed before it is suspended is left out of "
              "the checkpoint (the checkpoint is of the job as it then is); one killed while "
              "suspended changed the job under the checkpoint, which is abandoned; one killed "
              "once every image is taken does not change the checkpoint.  The application "
              "then sees its process killed, as it would without ckpt.  Kill -9 of the "
              "coordinator: every process lets go of the checkpoint, takes back what plugins "
              "released and runs on, no longer checkpointable; a half-written checkpoint "
              "directory (`.ckpt-N.tmp`) stays, never published.  A restart that loses its "
              "coordinator before RESUME ends its processes (exit status 70): they would run "
              "on half restored.  A restart writes no data (no full-disk case) and has no "
              "client of its own (`ckpt restart` runs its coordinator).", ""]
    (REPO / "docs" / "FAULTS.md").write_text("\n".join(lines))
