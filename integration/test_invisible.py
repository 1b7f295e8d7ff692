"""A checkpoint is invisible to the application: no EINTR, no early
return from a call that was waiting, and every signal stays its own."""
import subprocess
import time

import pytest

from harness import Job, command, restart_and_finish


def checkpoint_until_the_end(job, interval):
    """Checkpoint every `interval` seconds until the job ends; the images."""
    job.hold.unlink()   # it ends on its own
    while job.proc.poll() is None:
        proc = job.s.ckpt("checkpoint", job.id, check=False)
        if proc.returncode == 0:
            job.images.append(proc.stdout.strip().splitlines()[-1])
        time.sleep(interval)
    return job.images


def test_blocking_calls_checkpointed_every_100ms_then_restarted(session):
    """Each thread blocks again and again in one interruptible call (poll,
    select, epoll_wait, sleeps, sigtimedwait, futex, SO_RCVTIMEO, pause...)
    and fails at the first EINTR or early return; checkpointed every
    100 ms for 7 s, it must end as an uninterrupted run, and so must a
    restart from the middle checkpoint."""
    args = ["350", "20", "restartable"]
    session.start_reference("blocking_calls", *args)
    job = Job(session, "calls", "blocking_calls", *args)
    job.wait_ready()
    images = checkpoint_until_the_end(job, 0.1)
    assert job.wait() == 0, job.output()[-300:]
    reference = session.reference("blocking_calls", *args)
    assert job.output() == reference
    assert len(images) >= 10, f"only {len(images)} checkpoints in 7 s"
    middle = images[len(images) // 2]
    assert restart_and_finish(session, middle, job) == reference


def test_system_v_and_aio_waits_checkpointed_every_100ms(session):
    """semop, semtimedop, msgrcv and io_getevents too (their kernel objects
    are not restored yet, so no restart here)."""
    args = ["300", "20", "all"]
    session.start_reference("blocking_calls", *args)
    job = Job(session, "sysv-calls", "blocking_calls", *args)
    job.wait_ready()
    images = checkpoint_until_the_end(job, 0.1)
    assert job.wait() == 0, job.output()[-300:]
    reference = session.reference("blocking_calls", *args)
    assert job.output() == reference
    assert len(images) >= 5


def test_every_realtime_signal_is_the_applications(session):
    """Handlers for SIGRTMIN..SIGRTMAX, queued signals in order, a full mask
    that reads back whole, sigwaitinfo and signalfd on the last two."""
    args = ["300", "10"]
    session.start_reference("rtsignals", *args)
    job = Job(session, "rtsig", "rtsignals", *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(3)
    job.kill()
    reference = session.reference("rtsignals", *args)
    for image in (job.images[0], job.images[-1]):
        assert restart_and_finish(session, image, job) == reference


def test_the_job_lives_as_long_as_any_of_its_processes(session):
    """The first process ends at once, leaving a daemon and an orphan that
    work on together: `ckpt launch` exits with its status and names them,
    the job is still checkpointed, and a restart brings both back."""
    args = ["300", "10"]
    plain = subprocess.run(command("outlive", *args), capture_output=True, text=True,
                           timeout=120, cwd=session.work)
    assert plain.returncode == 3 and "PASS" in plain.stdout
    job = Job(session, "outlive", "outlive", *args, stderr_file=True)
    assert job.wait(timeout=60) == 3
    said = job.stderr_text()
    assert "exited with status 3; 2 of the job's processes still run" in said, said
    status = session.ckpt("status", "outlive").stdout
    assert "outlive" in status
    job.checkpoint_at_random_moments(2, 0.1, 0.4)
    session.ckpt("kill", "outlive")
    deadline = time.monotonic() + 30
    while session.ckpt("status", "outlive", check=False).returncode == 0:
        assert time.monotonic() < deadline, "the job did not end after ckpt kill"
        time.sleep(0.1)
    assert "PASS" not in job.output()
    assert restart_and_finish(session, job.images[0], job) == plain.stdout


@pytest.mark.parametrize("mode", ["strict", "filter"])
def test_seccomp_threads_are_refused_not_killed(session, mode):
    """A thread in seccomp strict mode or with a filter: the checkpoint is
    refused with one line naming it, the job goes on unharmed, and once the
    thread is gone the job is checkpointed and restarted as usual."""
    args = [mode, "300", "10"]
    reference = session.reference("seccomp_thread", *args)
    job = Job(session, f"seccomp-{mode}", "seccomp_thread", *args)
    job.wait_ready()
    refused = session.ckpt("checkpoint", job.id, check=False)
    assert refused.returncode != 0
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "seccomp" in refused.stderr and "not supported yet" in refused.stderr
    deadline = time.monotonic() + 60
    while "PHASE2" not in job.output():
        assert job.proc.poll() is None, job.output()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    job.checkpoint()
    job.kill()
    assert restart_and_finish(session, job.images[0], job) == reference


def wait_for_output(job, text, timeout=60):
    deadline = time.monotonic() + timeout
    while text not in job.output():
        assert job.proc.poll() is None, job.output()
        assert time.monotonic() < deadline, f"{job.id} never printed {text}"
        time.sleep(0.02)


def wait_until_gone(session, job_id, timeout=30):
    deadline = time.monotonic() + timeout
    while session.ckpt("status", job_id, check=False).returncode == 0:
        assert time.monotonic() < deadline, f"job {job_id} still has processes"
        time.sleep(0.1)


@pytest.mark.parametrize("mode", ["collected", "pending"])
def test_a_stopped_child_stays_stopped_through_checkpoint_and_restart(session, mode):
    """A child stopped with SIGSTOP is in every checkpoint without running
    and without its parent being told anything new (no SIGCHLD, no second
    stop; a stop it had not collected yet still there, once); --kill kills
    it too; restarted, it is stopped again, as its parent saw it."""
    args = [mode, "350", "10"]
    reference = session.reference("stopped_child", *args)
    job = Job(session, f"stopped-{mode}", "stopped_child", *args)
    job.wait_ready()
    wait_for_output(job, "STOPPED")
    job.checkpoint()
    job.checkpoint("--kill")
    assert job.wait(timeout=60) != 0
    wait_until_gone(session, job.id)
    assert "PASS" not in job.output()
    for image in job.images:
        assert restart_and_finish(session, image, job) == reference
