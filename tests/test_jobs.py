import dataclasses
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
                         command=["app"], job_dir="/x", launcher_start=jobs.process_start_time(pid))


def test_entry_file_keeps_the_key_other_versions_read(state):
    """The job directory is "ckpt_dir" in the file, whichever name it has here."""
    mine = entry("j1", os.getpid(), state)
    jobs.register(mine, state)
    on_disk = json.loads((state / "j1.json").read_text())
    assert on_disk["ckpt_dir"] == "/x" and "job_dir" not in on_disk
    assert jobs.find_job("j1", state).job_dir == "/x"
    # an entry that names it job_dir reads too
    on_disk["job_dir"] = on_disk.pop("ckpt_dir")
    (state / "j1.json").write_text(json.dumps(on_disk))
    assert jobs.find_job("j1", state).job_dir == "/x"


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


def test_a_dead_launchers_secret_and_shared_entry_go_with_its_entry(state, monkeypatch):
    shared = state / "shared"
    monkeypatch.setenv("CKPT_SHARED_STATE_DIR", str(shared))
    dead = subprocess.Popen(["true"])
    dead.wait()
    secret = state / f".secret-{jobs.this_host()}-{dead.pid}"
    secret.write_bytes(os.urandom(32))
    stale = entry("gone", dead.pid, state)
    stale.host, stale.address, stale.secret_file = jobs.this_host(), "127.0.0.1:1", str(secret)
    jobs.rewrite(stale, state)
    assert (shared / "gone.json").exists()
    assert jobs.list_jobs(state) == []
    assert not secret.exists() and not (shared / "gone.json").exists()


def test_another_hosts_coordinator_is_gone_when_its_port_is_refused(state):
    import socket
    with socket.socket() as probe:       # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    secret = state / "secret"
    secret.write_bytes(os.urandom(32))
    os.chmod(secret, 0o600)
    gone = jobs.JobEntry(job_id="j", socket="", launcher_pid=1, command=[], job_dir="/x",
                         host="elsewhere", address=f"127.0.0.1:{port}", secret_file=str(secret))
    assert jobs.coordinator_gone(gone)
    with socket.socket() as listener:    # someone listens who does not know the secret
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        other = jobs.JobEntry(**{**gone.__dict__, "address": f"127.0.0.1:{listener.getsockname()[1]}"})
        assert not jobs.coordinator_gone(dataclasses.replace(other, secret_file=str(state / "none")))


def test_forget_job_removes_an_unreachable_hosts_entry_and_secret(state, monkeypatch):
    shared = state / "shared"
    monkeypatch.setenv("CKPT_SHARED_STATE_DIR", str(shared))
    secret = state / ".secret-deadhost-12"
    secret.write_bytes(os.urandom(32))
    gone = jobs.JobEntry(job_id="77", socket="", launcher_pid=12, command=[], job_dir="/x",
                         host="deadhost", address="198.51.100.1:9", secret_file=str(secret))
    shared.mkdir(mode=0o700)
    (shared / "77.json").write_text(json.dumps(gone.__dict__))
    jobs.forget_job("77")
    assert not (shared / "77.json").exists() and not secret.exists()
