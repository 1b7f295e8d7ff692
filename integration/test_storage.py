"""How checkpoints are stored: retention, and what a forked write (the
default) promises when the job moves on while its images are written."""
import os

from harness import Job, restart_and_finish


def test_keep_two_of_ten(session):
    """--keep 2: after ten checkpoints only the newest two are left, `latest`
    leads to the newest, and it restarts like an uninterrupted run."""
    args = ["1200", "10"]
    reference = session.reference("counter", *args)
    job = Job(session, "keep", "counter", *args, launch_args=["--keep", "2"])
    job.wait_ready()
    job.checkpoint_at_random_moments(10, 0.02, 0.1)
    job.kill()
    job_dir = job.images[-1].parent
    # (and the job's event log, docs/EVENTS.md, which --keep never prunes)
    assert sorted(os.listdir(job_dir)) == ["ckpt-0009", "ckpt-0010", "events.jsonl", "latest"]
    assert (job_dir / "latest").resolve() == job.images[-1].resolve()
    assert restart_and_finish(session, job_dir, job) == reference


def test_images_listed_while_checkpoints_are_pruned(session):
    """`ckpt images` of a job whose --keep deletes checkpoints as fast as
    they come: a checkpoint deleted while it is being looked at is not
    shown, never reported damaged (the load test saw that)."""
    job = Job(session, "prune", "counter", "1500", "10",
              launch_args=["--keep", "2", "--interval", "0.05"])
    job.wait_ready()
    job_dir = session.images / "prune"
    listed = 0
    while job.proc.poll() is None and listed < 60:
        if (job_dir / "latest").exists():
            proc = session.ckpt("images", job_dir, check=False)
            assert proc.returncode == 0 and "CORRUPT" not in proc.stdout, proc.stdout + proc.stderr
            listed += 1
    if job.proc.poll() is None:
        job.kill()
    assert listed


def test_bad_keep_is_one_line_error(session):
    job = Job(session, "badkeep", "counter", "10", "10", launch_args=["--keep", "two"])
    rc = job.wait(timeout=30)
    err = job.proc.stderr.read()
    assert rc != 0 and "keep must be a whole number" in err and "Traceback" not in err, err
