"""Lazy restarts (--lazy, CKPT_LAZY): the processes resume before their
private memory is back and a page server brings it in on demand
(userfaultfd) and in the background.  The programs check every page of
their memory themselves after the restart (lazy_memory: each thread its
slice, a read() into and a write() from untouched lazy pages, children
with regions of their own), and their output must equal an uninterrupted
run's: raw, compressed and incremental images, from the first and the
last checkpoint.  The job's event log says when the last page was in.
Without the privileges userfaultfd needs the restart is refused in one
line; a page server that dies or an image cut short mid-stream ends the
job with one line and no process left behind."""
import json
import os
import signal
import time

import psutil
import pytest

from harness import Job, Restart, restart_and_finish
from test_engine import PROGRAMS

LAZY = {"CKPT_LAZY": "1"}


def lazy_restart_and_finish(session, image, job):
    session.extra_env.update(LAZY)
    try:
        return restart_and_finish(session, image, job)
    finally:
        for key in LAZY:
            session.extra_env.pop(key, None)


def lazy_done_events(session, job_id):
    log = session.images / job_id / "events.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()
            if json.loads(line)["kind"] == "lazy_restore_done"]


@pytest.mark.parametrize("shape,args,launch", [
    ("threads", ["lazy_memory", "100", "10", "64", "4", "0"], []),
    ("tree", ["lazy_memory", "100", "10", "16", "2", "3"], []),
    ("zstd", ["lazy_memory", "100", "10", "64", "3", "1"], ["--compress", "zstd"]),
    ("incremental", ["lazy_memory", "100", "10", "32", "2", "1"], ["--incremental"]),
    ("incremental-zstd", ["lazy_memory", "100", "10", "32", "2", "0"],
     ["--incremental", "--compress", "zstd"]),
], ids=["threads", "tree", "zstd", "incremental", "incremental-zstd"])
def test_lazy_restart_restores_every_page(session, shape, args, launch):
    """Checkpointed twice, killed, restarted lazily from the first and the
    last: every page checks out, the output is the uninterrupted run's."""
    reference = session.reference(*args)
    assert "PASS" in reference
    job = Job(session, f"lazy-{shape}", *args, launch_args=launch)
    job.wait_ready()
    job.checkpoint_at_random_moments(2)
    job.kill()
    for image in (job.images[0], job.images[-1]):
        assert lazy_restart_and_finish(session, image, job) == reference, \
            f"{shape} restarted lazily from {image.name} differs from an uninterrupted run"


@pytest.mark.parametrize("app", ["counter", "threads", "proctree", "bigmem"])
def test_engine_programs_restart_lazily(session, app):
    """Programs of the engine suite, restarted with --lazy: their own
    checks pass and the output is the uninterrupted run's."""
    args = PROGRAMS[app]
    reference = session.reference(app, *args)
    job = Job(session, f"lazy-{app}", app, *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(1)
    job.kill()
    assert lazy_restart_and_finish(session, job.images[-1], job) == reference


SMALL = ["lazy_memory", "60", "10", "64", "2", "0"]


def lazy_status(session, job_id):
    return json.loads(session.ckpt("status", job_id, "--json").stdout)["jobs"][0]


def paused_lazy_restart(session, job, image):
    """A lazy restart of image whose stream waits (CKPT_LAZY_PAUSE) until
    the returned file is removed; the program holds at its end."""
    pause = session.root / f"{job.id}.lazy-pause"
    pause.touch()
    session.extra_env.update(LAZY, CKPT_LAZY_PAUSE=str(pause))
    try:
        return job.restart_held(image), pause
    finally:
        session.extra_env.pop("CKPT_LAZY", None)
        session.extra_env.pop("CKPT_LAZY_PAUSE", None)


def _of_session(session, proc):
    """Whether proc runs with this session's job registry: another pytest
    worker's lazy restarts are none of this test's business."""
    try:
        return proc.environ().get("XDG_RUNTIME_DIR") == str(session.state)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def page_servers(session):
    return [p for p in psutil.process_iter(["name"])
            if p.info["name"] == "ckpt-pageserver" and _of_session(session, p)]


def job_processes(session, job):
    return [p for p in psutil.process_iter(["cmdline"])
            if "lazy_memory" in " ".join(p.info["cmdline"] or ()) and _of_session(session, p)]


def test_status_shows_memory_to_come_and_checkpoints_wait_for_it(session):
    """While pages are still to come `ckpt status` shows how many bytes and a
    checkpoint is refused in one line; once the last page is in the status
    says none, a checkpoint is taken, and the program's memory is right."""
    reference = session.reference(*SMALL)
    job = Job(session, "lazy-status", *SMALL)
    job.wait_ready()
    first = job.checkpoint()
    job.kill()
    restarted, pause = paused_lazy_restart(session, job, first)
    left = lazy_status(session, job.id)["lazy_bytes_left"]
    assert left and left > 0, left
    text = session.ckpt("status", job.id).stdout
    assert "memory to come" in text, text
    refused = session.ckpt("checkpoint", job.id, check=False)
    assert refused.returncode != 0
    assert len(refused.stderr.strip().splitlines()) == 1 and "lazy restart" in refused.stderr, \
        refused.stderr
    pause.unlink()
    deadline = time.monotonic() + 120
    while lazy_status(session, job.id)["lazy_bytes_left"] is not None:
        assert time.monotonic() < deadline, "the last page never came"
        time.sleep(0.1)
    done = lazy_done_events(session, job.id)
    assert len(done) == 1 and done[0]["bytes"] > 0, done
    job.checkpoint()
    job.hold.unlink()
    assert restarted.wait() == 0, restarted.stderr
    assert "the last page is in" in restarted.stderr, restarted.stderr
    assert job.output() == reference


def test_fork_mremap_and_dropped_pages_while_pages_arrive(session):
    """With the stream held, the restored program forks a child that reads
    a region no one touched yet, drops part of it (zeros) and moves part
    (mremap): each part is right where it is, in parent and child."""
    args = ["lazy_memory", "60", "10", "16", "2", "1", "churn"]
    reference = session.reference(*args)
    job = Job(session, "lazy-churn", *args)
    job.wait_ready()
    image = job.checkpoint()
    job.kill()
    restarted, pause = paused_lazy_restart(session, job, image)
    job.hold.unlink()
    assert restarted.wait(timeout=120) == 0, restarted.stderr
    assert job.output() == reference
    pause.unlink()


def test_page_server_killed_ends_the_job(session):
    """The page server killed while pages are still to come: the restart
    fails with one line, no process of the job is left waiting on a page,
    and the program never printed a result from wrong memory."""
    job = Job(session, "lazy-kill", *SMALL)
    job.wait_ready()
    image = job.checkpoint()
    job.kill()
    restarted, pause = paused_lazy_restart(session, job, image)
    servers = page_servers(session)
    assert len(servers) == 1, servers
    assert job_processes(session, job)      # the filter sees the paused job
    servers[0].send_signal(signal.SIGKILL)
    rc = restarted.wait(timeout=60)
    assert rc != 0
    assert "page server was killed" in restarted.stderr, restarted.stderr
    assert "Traceback" not in restarted.stderr
    assert not job_processes(session, job)
    assert "RESULT" not in job.output() and "PASS" not in job.output()
    pause.unlink()


def test_image_cut_short_mid_stream_ends_the_job(session):
    """The image truncated while its pages stream: one line naming it,
    the job ends, no process left, no result from wrong memory."""
    job = Job(session, "lazy-cut", *SMALL)
    job.wait_ready()
    image = job.checkpoint()
    job.kill()
    restarted, pause = paused_lazy_restart(session, job, image)
    files = sorted(image.glob("*.img"), key=lambda f: f.stat().st_size)
    with open(files[-1], "r+b") as f:
        f.truncate(f.seek(0, os.SEEK_END) // 2)
    pause.unlink()
    job.hold.unlink()
    rc = restarted.wait(timeout=60)
    assert rc != 0
    assert "cannot read its pages" in restarted.stderr, restarted.stderr
    assert "Traceback" not in restarted.stderr
    assert not job_processes(session, job)
    assert "PASS" not in job.output()


def test_image_removed_mid_stream_still_restores(session):
    """The checkpoint directory removed while pages stream: the page
    server reads from the files it holds open, and the memory is right."""
    reference = session.reference(*SMALL)
    job = Job(session, "lazy-rm", *SMALL)
    job.wait_ready()
    image = job.checkpoint()
    job.kill()
    restarted, pause = paused_lazy_restart(session, job, image)
    for f in image.iterdir():
        f.unlink()
    pause.unlink()
    job.hold.unlink()
    assert restarted.wait(timeout=120) == 0, restarted.stderr
    assert job.output() == reference


def test_lazy_refused_without_the_privileges(unprivileged_session):
    """An unprivileged user (vm.unprivileged_userfaultfd=0, /dev/userfaultfd
    root's): --lazy is refused in one line naming what an administrator can
    grant, before anything starts; the plain restart works."""
    session = unprivileged_session
    reference = session.reference(*SMALL)
    job = Job(session, "lazy-unpriv", *SMALL)
    job.wait_ready()
    image = job.checkpoint()
    job.kill()
    refused = session.ckpt("restart", "--lazy", image, check=False)
    assert refused.returncode == 2, refused
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    for words in ("root", "vm.unprivileged_userfaultfd=1", "/dev/userfaultfd"):
        assert words in lines[0], lines[0]
    assert not job_processes(session, job)
    assert restart_and_finish(session, image, job) == reference


def test_periodic_checkpoints_and_keep_wait_for_the_last_page(session):
    """A lazy restart with periodic checkpoints and --keep 1 (CKPT_KEEP):
    while pages are still to come no checkpoint is taken, so the one the
    restart reads is never pruned; once the last page is in, periodic
    checkpoints come and prune it; the program's memory is right."""
    reference = session.reference(*SMALL)
    job = Job(session, "lazy-keep", *SMALL)
    job.wait_ready()
    image = job.checkpoint()
    job.kill()
    session.extra_env["CKPT_KEEP"] = "1"
    pause = session.root / "lazy-keep.pause"
    pause.touch()
    session.extra_env.update(LAZY, CKPT_LAZY_PAUSE=str(pause))
    job.hold.touch()
    try:
        restarted = Restart(session, image, "--interval", "0.2")
        restarted.wait_registered(job.id)
    finally:
        for key in ("CKPT_KEEP", "CKPT_LAZY", "CKPT_LAZY_PAUSE"):
            session.extra_env.pop(key, None)
    time.sleep(1.0)  # five intervals: none may checkpoint while pages are to come
    taken = sorted(p.name for p in image.parent.glob("ckpt-*"))
    assert taken == [image.name] and (image / "manifest.yaml").exists(), taken
    pause.unlink()
    deadline = time.monotonic() + 120
    while image.exists():
        assert time.monotonic() < deadline, "no periodic checkpoint after the last page"
        time.sleep(0.1)
    job.hold.unlink()
    assert restarted.wait() == 0, restarted.stderr
    assert job.output() == reference
