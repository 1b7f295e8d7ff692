"""Node-local staging (--stage-dir): each process's image is written to the
stage directory first, then copied to the checkpoint directory by
ckpt-flush while the job runs on; the checkpoint is published once every
copy is complete.  Restarts from the first, a middle and the last
checkpoint give the uninterrupted run's output; a restart reads the staged
copy when it checks out; a full stage directory, a full checkpoint
directory during the copy and a killed copier each fail one checkpoint in
one line, the job runs on, and the earlier checkpoint stays restorable."""
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from ckpt.image import memory_records
from harness import Job, restart_and_finish
from test_engine import PROGRAMS
from test_faults import one_line
from test_incremental import DIRTY, own_and_referred
from test_multihost import jobs  # noqa: F401  (the fixture)

COUNTER = ["counter", "100", "10"]  # held after its steps until the test lets it end
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="mounts a small tmpfs (root)")


def manifest(checkpoint):
    return yaml.safe_load((checkpoint / "manifest.yaml").read_text())


def staged_files(stage, job_id):
    """{checkpoint name: its staged files} on this host."""
    return {d.name: sorted(f.name for f in d.iterdir())
            for d in sorted((stage / job_id).iterdir())}


def page_data_offset(image):
    """An offset in the middle of the image's largest run of page data: a
    byte there matters to a restore of the image, not to another host's
    restart, which reads the image's records alone (its peers)."""
    size, offset = max((vma.data_size, vma.data_offset) for vma in memory_records(image))
    assert size >= 4096, f"{image}: no page data"
    return offset + size // 2


def restarts_like_reference(session, job, checkpoints, reference):
    for path in checkpoints:
        assert restart_and_finish(session, path, job) == reference, \
            f"{job.id} restarted from {path.name} differs from an uninterrupted run"


def mounted_tmpfs(path, size):
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], check=True)
    return path


def only_the_first(first):
    """The job's directory holds the first checkpoint, nothing half-written."""
    names = sorted(p.name for p in first.parent.iterdir() if p.name.startswith((".ckpt", "ckpt")))
    return names == [first.name]


def fill(fs, leave):
    """Take all but `leave` bytes of fs."""
    free = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize
    with open(fs / "filler", "wb") as f:
        f.truncate(0)
        os.posix_fallocate(f.fileno(), 0, max(free - leave, 4096))


@pytest.mark.parametrize("app", ["sharedmem", "proctree", "mem_advice"])
def test_staged_checkpoints_restart(session, app):
    """Three staged checkpoints at random moments (mem_advice cannot fork a
    writer: it writes in place, and a child copies): every image was
    copied (the manifest's flush_ns), the stage keeps only the newest copy
    of each image, and restarts from the first and the last are right."""
    args = PROGRAMS[app]
    stage = session.root / "stage"
    reference = session.reference(app, *args)
    job = Job(session, f"stg-{app}", app, *args, launch_args=["--stage-dir", stage])
    job.wait_ready()
    job.checkpoint_at_random_moments(3)
    job.kill()
    for path in job.images:
        data = manifest(path)
        assert data["stage_dir"] == str(stage)
        assert all(p["flush_ns"] > 0 for p in data["processes"]), data
    newest = manifest(job.images[-1])
    images = sorted(name for p in newest["processes"] for name in (p["image"], p["image"] + ".sum"))
    assert staged_files(stage, job.id) == {job.images[-1].name: images}
    assert not list(job.images[-1].glob("*.done*")), "a copier's result file was published"
    restarts_like_reference(session, job, [job.images[0], job.images[-1]], reference)


def test_staged_compressed_incremental(session):
    """Staged, compressed and incremental together, one checkpoint in place:
    the page lists travel with the images, later checkpoints hold little of
    their own, and restarts from the first, a middle and the last are right."""
    stage = session.root / "stage"
    reference = session.reference(*DIRTY)
    job = Job(session, "stg-inc", *DIRTY,
              launch_args=["--stage-dir", stage, "--incremental", "--compress", "zstd"])
    job.wait_ready()
    job.checkpoint_at_random_moments(2, 0.2, 0.5)
    job.checkpoint("--in-place")
    job.checkpoint_at_random_moments(1, 0.2, 0.5)
    job.kill()
    full_own, _ = own_and_referred(job.images[0])
    for path in job.images[1:]:
        own, referred = own_and_referred(path)
        assert own < full_own / 4 and referred > full_own / 2, (path.name, own, referred)
        assert list(path.glob("*.pages")), f"{path.name}: no page list was copied"
    restarts_like_reference(session, job, [job.images[0], job.images[2], job.images[-1]],
                            reference)


def test_restart_reads_the_staged_copy(session):
    """A restart on the host that staged a checkpoint reads the staged copy
    when it checks out (here the shared copy is damaged, so nothing else
    would do), and falls back to the shared copy, with a warning, when the
    staged one does not."""
    stage = session.root / "stage"
    reference = session.reference(*COUNTER)
    job = Job(session, "stg-read", *COUNTER, launch_args=["--stage-dir", stage])
    job.wait_ready()
    checkpoint = job.checkpoint()
    job.kill()
    shared = next(checkpoint.glob("*.img"))
    staged = stage / job.id / checkpoint.name / shared.name
    good = shared.read_bytes()
    damaged = bytearray(good)
    damaged[len(good) // 2] ^= 0xFF
    shared.write_bytes(damaged)
    assert restart_and_finish(session, checkpoint, job) == reference
    shared.write_bytes(good)
    staged.write_bytes(damaged)
    restart = session.ckpt("restart", checkpoint)
    assert "staged copy does not check out" in restart.stderr, restart.stderr
    assert job.output() == reference
    shared.write_bytes(damaged)
    failed = session.ckpt("restart", checkpoint, check=False)
    assert failed.returncode != 0 and "checksum mismatch" in failed.stderr, failed.stderr
    assert "Traceback" not in failed.stderr


@needs_root
def test_full_stage_dir_fails_one_checkpoint(session):
    """The stage keeps the newest copy of each image: with room for one, the
    second staged checkpoint fails for want of space in one line, the job
    runs on to the right output, and the first restarts."""
    stage = mounted_tmpfs(session.root / "small-stage", "7m")
    try:
        reference = session.reference(*COUNTER)
        job = Job(session, "stg-full", *COUNTER, launch_args=["--stage-dir", stage])
        job.wait_ready()
        first = job.checkpoint()                      # about 4.5 MiB: fits
        one_line(session.ckpt("checkpoint", job.id, check=False), "No space left", str(stage))
        assert job.wait() == 0, "the job must survive the failed checkpoint"
        assert job.output() == reference
        assert only_the_first(first)
        assert restart_and_finish(session, first, job) == reference
    finally:
        subprocess.run(["umount", "-l", stage])


@needs_root
def test_full_ckpt_dir_during_the_copy(session):
    """The staged write succeeds, the copy to a checkpoint directory that
    filled up meanwhile fails: one line, nothing of it is left in the
    checkpoint directory, the job runs on, the first checkpoint restarts."""
    fs = mounted_tmpfs(session.root / "small-ckpt", "24m")
    try:
        reference = session.reference(*COUNTER)
        session.images = fs
        job = Job(session, "stg-flush", *COUNTER,
                  launch_args=["--stage-dir", session.root / "stage"])
        job.wait_ready()
        first = job.checkpoint()
        fill(fs, 1 << 20)                              # room for the manifest, not an image
        line = one_line(session.ckpt("checkpoint", job.id, check=False), "No space left")
        assert "copying" in line, line
        assert job.wait() == 0, "the job must survive the failed checkpoint"
        assert job.output() == reference
        assert only_the_first(first)
        (fs / "filler").unlink()
        assert restart_and_finish(session, first, job) == reference
    finally:
        subprocess.run(["umount", "-l", fs])


def _kill_copier(job_pids):
    """SIGKILL the first ckpt-flush seen whose parent is one of job_pids
    (an in-place write's copier is the process's child); whether it was."""
    for proc in psutil.process_iter(["name", "ppid"]):
        if proc.info["name"] == "ckpt-flush" and proc.info["ppid"] in job_pids:
            proc.send_signal(signal.SIGKILL)
            return True
    return False


def test_killed_copier_fails_one_checkpoint(session):
    """kill -9 of the copier while it copies a large image (written in
    place, staged, so the copier is the process's child): the checkpoint
    fails in one line, the job runs on, the earlier checkpoint restarts and
    the next checkpoint succeeds."""
    app = ["bigmem", "200", "10", "256"]  # 256 MiB: the copy takes a while
    reference = session.reference(*app)
    job = Job(session, "stg-kill", *app,
              launch_args=["--stage-dir", session.root / "stage", "--in-place"])
    job.wait_ready()
    first = job.checkpoint()
    pids = {c.pid for c in psutil.Process(job.proc.pid).children(recursive=True)}
    for _attempt in range(5):  # the copier may finish before it is seen
        taking = subprocess.Popen(session.ckpt_argv("checkpoint", job.id), cwd=session.work,
                                  env=session.env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        killed = False
        while taking.poll() is None and not killed:
            killed = _kill_copier(pids)
            time.sleep(0.002)
        out, err = taking.communicate(timeout=120)
        if killed:
            break
    assert killed, "the copier was never seen running"
    assert taking.returncode != 0, out
    assert len(err.strip().splitlines()) == 1 and "copier of its staged image died" in err, err
    assert job.proc.poll() is None, "the job must survive the failed checkpoint"
    last = job.checkpoint()
    job.kill()
    assert restart_and_finish(session, first, job) == reference
    assert restart_and_finish(session, last, job) == reference


@pytest.mark.multihost
def test_multihost_staged_on_each_host(cluster, jobs, request):
    """An MPI ring on h1, h2 with --stage-dir in each host's own /dev/shm:
    each host's stage holds its own images and no other's; with the shared
    copy of an h1 image damaged, a restart on h1, h2 reads the staged copies
    and ends with the uninterrupted run's result, while one on h3, h4 (no
    staged copy there) refuses the damaged image in one line."""
    args = (300, 20)
    job = jobs(request.node.name, "openmpi", ["h1", "h2"], "ring", args)
    job.env["CKPT_STAGE_DIR"] = "/dev/shm/ckpt-stage"
    try:
        _staged_on_each_host(cluster, job, args)
    finally:  # the staged copies stay by design: the next test on these hosts must not see them
        for host in ("h1", "h2", "h3", "h4"):
            cluster.run(host, ["rm", "-rf", f"/dev/shm/ckpt-stage/{job.id}"])


def _staged_on_each_host(cluster, job, args):
    from test_multihost import reference_result
    job.start()
    checkpoint = Path(job.ckpt("h2", "checkpoint", job.id).stdout.strip())
    job.ckpt("h1", "kill", job.id)
    job.proc.wait(timeout=30)
    procs = manifest(checkpoint)["processes"]
    assert all(p["flush_ns"] > 0 for p in procs), procs
    for host in ("h1", "h2", "h3"):
        listed = cluster.run(host, ["ls", f"/dev/shm/ckpt-stage/{job.id}/{checkpoint.name}"],
                             capture_output=True, text=True).stdout.split()
        assert sorted(listed) == sorted(name for p in procs if p["host"] == host
                                        for name in (p["image"], p["image"] + ".sum")), \
            (host, listed)
    image = checkpoint / next(p["image"] for p in procs if p["host"] == "h1")
    good = image.read_bytes()
    damaged = bytearray(good)
    damaged[page_data_offset(image)] ^= 0xFF
    image.write_bytes(damaged)
    elsewhere = job.ckpt("h3", "restart", "--hosts", "h3,h4", checkpoint, check=False)
    assert elsewhere.returncode != 0 and "checksum mismatch" in elsewhere.stderr, \
        elsewhere.stderr
    assert "Traceback" not in elsewhere.stderr
    job.restart(checkpoint, ["h1", "h2"], "staged").finish()
    assert job.results() == reference_result(cluster, "openmpi", "ring", args, job.dir)
