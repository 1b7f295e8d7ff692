import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from ckpt import jobs
from ckpt.errors import CkptError


@pytest.fixture
def state(monkeypatch):
    root = Path(tempfile.mkdtemp(prefix="ckj"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(root))
    yield jobs.state_dir()
    shutil.rmtree(root, ignore_errors=True)


def entry(job_id, pid, state):
    return jobs.JobEntry(job_id=job_id, socket=jobs.socket_path_for(pid, state), launcher_pid=pid,
                         command=["app"], ckpt_dir="/x", launcher_start=jobs.process_start_time(pid))


def test_state_dir_is_private(state):
    assert state.name == "ckpt"
    assert state.stat().st_mode & 0o777 == 0o700
    assert len(jobs.socket_path_for(4194304, state)) < 108


def test_register_find_unregister(state, monkeypatch):
    mine = entry("j1", os.getpid(), state)
    jobs.register(mine, state)
    assert jobs.find_job("j1", state).launcher_pid == os.getpid()
    monkeypatch.setattr(jobs, "wait_until_gone", lambda *a, **k: False)  # no 5 s wait here
    with pytest.raises(CkptError, match="already running"):
        jobs.register(mine, state)
    jobs.unregister(mine, state)
    with pytest.raises(CkptError, match="no running job"):
        jobs.find_job("j1", state)


def test_stale_entries_are_cleaned(state):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = entry("gone", dead.pid, state)
    (state / "gone.json").write_text(json.dumps(stale.__dict__))
    Path(stale.socket).write_text("")
    assert jobs.list_jobs(state) == []
    assert not (state / "gone.json").exists()
    assert not Path(stale.socket).exists()


def test_reused_pid_is_not_our_launcher(state):
    reused = entry("old", os.getpid(), state)
    reused.launcher_start += 1
    (state / "old.json").write_text(json.dumps(reused.__dict__))
    assert jobs.list_jobs(state) == []


@pytest.mark.parametrize("bad", ["", "../x", ".hidden", "a b", "x" * 64])
def test_job_id_validation(bad):
    with pytest.raises(CkptError, match="invalid job id"):
        jobs.check_job_id(bad)
