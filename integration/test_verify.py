"""A restore that proves itself (issue 37, ckpt/verify.py): a restart
compares what the kernel shows of each restored process with the
checkpoint's fingerprint of it, before the process runs on.

A restore known to be wrong (a FIFO's write end comes back O_RDWR: it is
opened without blocking, for want of a reader) fails the restart with one
line naming the difference, and leaves nothing running; restores known to
be right pass it (no false positives), among them issue 37's first shape,
a pipe end reopened through /proc/self/fd with flags of its own."""
import json
import subprocess

import pytest

from harness import Job, reap_orphans

REOPEN_ARGS = ["100", "10"]
FIFO_ARGS = ["100", "10", "."]


def launch_checkpoint_kill(session, job_id, app, args):
    job = Job(session, job_id, app, *args)
    job.wait_ready()
    image = job.checkpoint("--kill")
    job.proc.wait(timeout=60)
    reap_orphans()
    job.hold.unlink(missing_ok=True)  # the restarted program runs to its end
    return job, image


def restart(session, image, *options, timeout=300):
    proc = subprocess.run(session.ckpt_argv("restart", *options, image), cwd=session.work,
                          env=session.env(), capture_output=True, text=True, timeout=timeout)
    reap_orphans()
    return proc


def test_a_wrong_restore_fails_a_verified_restart(session):
    """A FIFO's write end: today's restore opens it O_RDWR.  --verify=on
    fails the restart in one line that names the fd and both flags, and
    kills the restored process."""
    job, image = launch_checkpoint_kill(session, "v-fifo", "fifos", FIFO_ARGS)
    fingerprint = json.loads((image / "fingerprint-{}.json".format(
        json.loads((image / "manifest.yaml").read_text())["processes"][0]["host"])).read_text())
    assert fingerprint["processes"], "no process fingerprinted at the checkpoint"
    before = job.output()
    proc = restart(session, image, "--verify=on")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"not one line: {proc.stderr!r}"
    line = lines[0]
    assert line.startswith("ckpt: error: ") and "Traceback" not in proc.stderr
    assert " flags: O_WRONLY" in line and "at the checkpoint, O_RDWR" in line, line
    # the restored process never ran on: no line after the checkpoint's
    assert job.output() == before
    assert session.ckpt("list").stdout == "", "the failed restart left its job running"
    differences = (image.parent / f"verify-{image.name}.txt").read_text()
    assert "flags: O_WRONLY" in differences


def test_a_warned_restart_names_the_difference_and_goes_on(session):
    job, image = launch_checkpoint_kill(session, "v-warn", "fifos", FIFO_ARGS)
    proc = restart(session, image, "--verify=warn")
    assert "ckpt: warning: restore differs: process " in proc.stderr, proc.stderr
    assert " flags: O_WRONLY" in proc.stderr
    assert "RESULT" in job.output() or "FAIL" in job.output(), "the restored program did not run on"


def test_a_reopened_pipe_end_keeps_its_own_flags(session):
    """Issue 37, shape 1: restored with an open file description of its own."""
    reference = session.reference("pipe_reopen", *REOPEN_ARGS)
    assert "PASS" in reference
    job, image = launch_checkpoint_kill(session, "v-reopen-off", "pipe_reopen", REOPEN_ARGS)
    proc = restart(session, image, "--verify=off")
    assert proc.returncode == 0, f"{proc.stderr.strip()}; output ends {job.output()[-300:]!r}"
    assert job.output() == reference


# programs whose restore is exact as far as the fingerprint sees: verified
# restarts of them must pass (no false positives), programs of several
# processes among them (their stdin, one open file description of
# /dev/null shared by all, comes back shared)
EXACT = {
    "counter": ["150", "10"],
    "threads": ["250", "5"],
    "bigmem": ["200", "10", "512"],
    "files": ["150", "10", "."],
    "itimer": ["150"],
    "eventfds": ["150", "10"],
    "pipe_states": ["150", "10"],
    "pipe_reopen": REOPEN_ARGS,
    "socket_dead_peers": ["150", "10"],
    "mem_droppable": ["150", "10"],
    "unlinked_private_maps": ["150", "10", "."],
    "ctty_reopen": ["150", "10"],
    "proc_maps_peers": ["150", "10"],
    "deleted_in_removed_dir": ["150", "10", "."],
    "socket_dgram_dead_peers": ["150", "10", "."],
    "ctty_shared_fork": ["150", "10"],
    "pipe_orphans": ["150", "10", "."],
    "task_fds": ["150", "10"],
    "unlinked_maps_no_fd": ["150", "10", "."],
    "task_fds_fork": ["150", "10"],
    "ptys": ["150", "10"],
    "posix_timers": ["150", "10"],
    "process_limits": ["150", "10"],
}


# issue 37's shapes, fixed: their restart has nothing to warn of
SILENT = {"pipe_reopen", "socket_dead_peers", "mem_droppable", "unlinked_private_maps",
          "ctty_reopen", "proc_maps_peers", "deleted_in_removed_dir",
          "socket_dgram_dead_peers", "ctty_shared_fork", "pipe_orphans",
          "task_fds", "unlinked_maps_no_fd", "task_fds_fork"}


@pytest.mark.parametrize("app", sorted(EXACT))
def test_verified_restarts_of_exact_restores_pass(session, app):
    args = EXACT[app]
    session.start_reference(app, *args)
    job = Job(session, f"v-{app}", app, *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(1)
    image = job.checkpoint("--kill")
    job.proc.wait(timeout=60)
    reap_orphans()
    job.hold.unlink(missing_ok=True)
    reference = session.reference(app, *args)
    proc = restart(session, image, "--verify=on")
    assert proc.returncode == 0, f"{app}: {proc.stderr.strip()}"
    assert "restore differs" not in proc.stderr
    if app in SILENT:
        assert "warning" not in proc.stderr, f"{app}: {proc.stderr.strip()}"
    assert job.output() == reference, f"{app} restarted differs: {job.output()[-300:]}"
