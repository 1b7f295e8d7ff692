"""The job's paths, named in one place."""

from pathlib import Path

from ckpt import paths


def test_a_jobs_paths():
    job = paths.job_dir("/c", "j1")
    assert job == Path("/c/j1") and paths.ckpt_dir_of(job) == Path("/c")
    assert paths.checkpoint_dir(job, 7) == Path("/c/j1/ckpt-0007")
    assert paths.job_dir_of(paths.checkpoint_dir(job, 7)) == job
    assert paths.checkpoint_number("/c/j1/ckpt-0007") == 7
    assert paths.checkpoint_number(paths.checkpoint_dir(job, 12345)) == 12345
    assert paths.tmp_dir(job, 7) == Path("/c/j1/.ckpt-0007.tmp")
    assert paths.TMP_RE.match(paths.tmp_name(7)) and paths.CKPT_RE.match(paths.checkpoint_name(7))
    assert paths.staged_dir("/dev/shm/s", "j1", 7) == Path("/dev/shm/s/j1/ckpt-0007")
    assert paths.coordinator_log(job) == Path("/c/j1/coordinator.log")


def test_secret_files(tmp_path):
    secret = paths.secret_file(tmp_path, "h1", 42)
    assert secret == tmp_path / ".secret-h1-42"
    secret.write_text("x")
    (tmp_path / "ckpt-0001").mkdir()
    assert paths.secret_files(tmp_path) == [secret]
