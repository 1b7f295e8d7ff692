"""Incremental checkpoints (--incremental, --full-every): each checkpoint
writes only the pages that changed since the previous one and refers to
the earlier images for the rest; restarts from the first, a middle and the
last checkpoint of a chain give the uninterrupted run's output; a damaged
or missing earlier checkpoint is one line of error before anything is
restored; --keep never deletes a checkpoint a kept one reads from."""
import os
from pathlib import Path

import pytest
import yaml

from harness import Job, restart_and_finish
from test_engine import PROGRAMS

DIRTY = ["dirty_pages", "200", "15", "32"]  # 32 MiB, a few pages changed per step


def manifest(checkpoint):
    return yaml.safe_load((checkpoint / "manifest.yaml").read_text())


def own_and_referred(checkpoint):
    procs = manifest(checkpoint)["processes"]
    return sum(p["own"] for p in procs), sum(p["referred"] for p in procs)


def restarts_like_reference(session, job, checkpoints, reference):
    for path in checkpoints:
        assert restart_and_finish(session, path, job) == reference, \
            f"{job.id} restarted from {path.name} differs from an uninterrupted run"


@pytest.mark.parametrize("app", ["threads", "sharedmem", "private_maps", "proctree"])
def test_incremental_checkpoints_restart(session, app):
    """Three checkpoints at random moments, each against the one before:
    a restart from the first, the middle and the last gives the
    uninterrupted run's output."""
    args = PROGRAMS[app]
    reference = session.reference(app, *args)
    job = Job(session, f"inc-{app}", app, *args, launch_args=["--incremental"])
    job.wait_ready()
    job.checkpoint_at_random_moments(3)
    job.kill()
    chain = [manifest(path) for path in job.images]
    assert chain[0]["parent"] is None and chain[0]["chain"] == 0
    assert [m["parent"] for m in chain[1:]] == [m["checkpoint"] for m in chain[:-1]], chain
    restarts_like_reference(session, job, job.images, reference)


@pytest.mark.parametrize("launch", [["--compress", "zstd"], ["--compress", "auto", "--in-place"]],
                         ids=["forked-zstd", "in-place-auto"])
def test_changed_pages_alone_are_written(session, launch):
    """A program that changes a few pages per step, drops pages (they read
    as zeros, unwritten) and maps a window again: later checkpoints hold a
    small part of its memory and refer to the earlier ones for the rest;
    restarts from every one of them, compressed or not, are right."""
    reference = session.reference(*DIRTY)
    job = Job(session, "inc-dirty-" + "-".join(launch).replace("--", ""), *DIRTY,
              launch_args=["--incremental", *launch])
    job.wait_ready()
    job.checkpoint_at_random_moments(4, 0.2, 0.5)
    job.kill()
    full_own, full_referred = own_and_referred(job.images[0])
    assert full_referred == 0 and full_own >= 32 << 20
    for path in job.images[1:]:
        own, referred = own_and_referred(path)
        assert own < full_own / 4 and referred > full_own / 2, (path.name, own, referred)
        assert manifest(path)["needs"], path
    listing = session.ckpt("images", job.images[-1].parent).stdout
    assert "incremental on ckpt-0003" in listing and "CORRUPT" not in listing, listing
    restarts_like_reference(session, job, [job.images[0], job.images[2], job.images[-1]],
                            reference)


def test_a_restarted_job_goes_on_incrementally(session):
    """Restarted from an incremental checkpoint, the job's next checkpoints
    are incremental too (against the newest); killed, restarted from the
    last: the uninterrupted run's output."""
    reference = session.reference(*DIRTY)
    job = Job(session, "inc-chain", *DIRTY, launch_args=["--incremental"])
    job.wait_ready()
    job.checkpoint_at_random_moments(2, 0.1, 0.3)
    job.kill()
    restarted = job.restart_held(job.images[-1])
    job.checkpoint_at_random_moments(2, 0.1, 0.3)
    job.kill()
    restarted.wait()
    assert [manifest(p)["chain"] for p in job.images] == [0, 1, 2, 3]
    assert manifest(job.images[-1])["restarted_from"] == 2
    restarts_like_reference(session, job, [job.images[-1]], reference)


def test_full_every_bounds_the_chain(session):
    """--full-every 2: every other checkpoint is a full one, reading from none."""
    job = Job(session, "inc-full-every", *DIRTY, launch_args=["--incremental", "--full-every", "2"])
    job.wait_ready()
    job.checkpoint_at_random_moments(4, 0.1, 0.2)
    job.kill()
    assert [(manifest(p)["chain"], bool(manifest(p)["needs"])) for p in job.images] == \
        [(0, False), (1, True), (0, False), (1, True)]


def one_line_error(result):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1 and lines[0].startswith(("ckpt: error:", "ckpt-restart:")), result.stderr
    return lines[0]


def test_damaged_or_missing_parent_is_one_line_of_error(session):
    """A byte changed in the first checkpoint's image makes a restart from
    the last fail on its checksum, before anything is restored; with the
    first checkpoint gone, the restart says which one is missing."""
    job = Job(session, "inc-damaged", *DIRTY, launch_args=["--incremental"])
    job.wait_ready()
    job.checkpoint_at_random_moments(3, 0.1, 0.3)
    job.kill()
    first = job.images[0]
    image = first / manifest(first)["processes"][0]["image"]
    data = bytearray(image.read_bytes())
    data[len(data) // 2] ^= 0x5a
    image.write_bytes(bytes(data))
    before = job.output()
    line = one_line_error(session.ckpt("restart", job.images[-1], check=False))
    assert "checksum mismatch" in line and "ckpt-0001" in line, line
    os.rename(first, first.with_name(".gone"))
    line = one_line_error(session.ckpt("restart", job.images[-1], check=False))
    assert "reads memory from ckpt-0001, which is gone" in line, line
    assert job.output() == before, "something ran although the restart was refused"


def test_keep_spares_the_checkpoints_kept_ones_read(session):
    """--keep 2 over ten incremental checkpoints (a full one every 6): the
    newest two are left, and every checkpoint they read from, no other;
    the newest restarts like an uninterrupted run."""
    reference = session.reference(*DIRTY)
    job = Job(session, "inc-keep", *DIRTY,
              launch_args=["--incremental", "--full-every", "6", "--keep", "2"])
    job.wait_ready()
    job.checkpoint_at_random_moments(10, 0.05, 0.15)
    job.kill()
    job_dir = job.images[-1].parent
    left = sorted(name for name in os.listdir(job_dir) if name.startswith("ckpt-"))
    needed = {f"ckpt-{n:04d}" for path in job.images[-2:] for n in manifest(path)["needs"]}
    assert "ckpt-0007" in needed  # the full one the last four build on
    assert left == sorted(needed | {"ckpt-0009", "ckpt-0010"}), (left, needed)
    assert restart_and_finish(session, job_dir, job) == reference


def test_bad_full_every_is_one_line_error(session):
    job = Job(session, "inc-bad", "counter", "10", "10",
              launch_args=["--incremental", "--full-every", "0"])
    rc = job.wait(timeout=30)
    err = job.proc.stderr.read()
    assert rc != 0 and "full_every must be between 1 and 64" in err and "Traceback" not in err, err


@pytest.mark.multihost
def test_multihost_restart_from_incremental_images(cluster, jobs, request):
    """An MPI ring on h1, h2 checkpointed twice incrementally (each host's
    processes write their images and page lists to the shared directory),
    restarted from the second on h3, h4: the uninterrupted run's result."""
    from test_multihost import reference_result
    args = (300, 20)
    job = jobs(request.node.name, "openmpi", ["h1", "h2"], "ring", args)
    job.env["CKPT_INCREMENTAL"] = "1"
    job.start()
    first = job.ckpt("h2", "checkpoint", job.id).stdout.strip()
    last = job.ckpt("h1", "checkpoint", "--kill", job.id).stdout.strip()
    assert job.proc.wait(timeout=30) != 0
    assert manifest(Path(last))["needs"] == [manifest(Path(first))["checkpoint"]]
    assert {p["host"] for p in manifest(Path(last))["processes"] if p["referred"]} == {"h1", "h2"}
    job.restart(last, ["h3", "h4"], "incremental").finish()
    assert job.results() == reference_result(cluster, "openmpi", "ring", args, job.dir)


from test_multihost import jobs  # noqa: E402,F401  (the fixture)
