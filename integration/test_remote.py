"""Processes a job starts through ssh join it (native/remote).

A real sshd of the test's own runs on 127.0.0.2, an address that MPICH's
hydra and Open MPI take for another host, so that both launch their
remote daemons through ssh.  The ssh the job runs is the real client,
called through a wrapper named ssh that gives it the test's config.
"""
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from harness import APPS, REPO, Job, checkpoint_kill_restart, restart_and_finish
from test_mpi import MPI_BIN, MPIRUN, have

SSHD = Path("/usr/sbin/sshd")
HOST = "127.0.0.2"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True)


def ssh_wrapper(path, config, delay=0):
    """An executable named ssh: the real client with the test's config."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nsleep {delay}\nexec /usr/bin/ssh -F {config} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


class Sshd:
    def __init__(self, root):
        self.root = root
        self.port = free_port()
        keygen(root / "host_key")
        keygen(root / "id")
        shutil.copy(root / "id.pub", root / "authorized_keys")
        (root / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress {HOST}\nHostKey {root}/host_key\n"
            f"AuthorizedKeysFile {root}/authorized_keys\nPidFile {root}/sshd.pid\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n")
        self.config = root / "ssh_config"
        self.config.write_text(
            f"Host *\n  Port {self.port}\n  IdentityFile {root}/id\n"
            "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
            "  LogLevel ERROR\n  BatchMode yes\n")
        self.ssh = ssh_wrapper(root / "bin" / "ssh", self.config)
        os.makedirs("/run/sshd", exist_ok=True)  # its privilege separation
        self.proc = subprocess.Popen([str(SSHD), "-D", "-f", str(root / "sshd_config"),
                                      "-E", str(root / "sshd.log")])
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((HOST, self.port), timeout=1).close()
                return
            except OSError:
                assert self.proc.poll() is None, (root / "sshd.log").read_text()
                assert time.monotonic() < deadline, "sshd did not start"
                time.sleep(0.05)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    if os.getuid() != 0 or not SSHD.exists():
        pytest.skip("needs root and openssh-server (./setup.sh installs it)")
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


def test_ssh_command_is_checkpointed_with_the_job(session, sshd):
    """The remote counter, its server and the relaying client are all in
    the job: restarted, it finishes with the uninterrupted run's output."""
    app = [sshd.ssh, "-x", HOST, APPS / "counter"]
    args = ["600", "10"]
    reference = session.reference(app, *args)
    assert "PASS" in reference
    job = Job(session, "ssh-counter", app, *args)
    job.wait_ready()
    status = session.ckpt("status", job.id).stdout
    assert status.count("@") >= 3, f"ssh client, server and counter: {status}"
    job.checkpoint_at_random_moments(3, 0.1, 0.5)
    job.kill()
    image = session.rng.choice(job.images)
    assert restart_and_finish(session, image, job) == reference


def test_ssh_passes_stdin_stderr_and_exit_status(session, sshd):
    proc = subprocess.run(
        session.ckpt_argv("launch", "--job-id", "ssh-status", "--ckpt-dir", session.images,
                          "--", sshd.ssh, HOST, "read x; echo got $x; echo oops >&2; exit 7"),
        input="hello\n", cwd=session.work, env=session.env(), capture_output=True,
        text=True, timeout=60)
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout == "got hello\n"
    assert "oops" in proc.stderr


def test_ssh_failure_is_reported(session, sshd, tmp_path):
    """A host that refuses: ssh's own message and exit status, no hang."""
    config = tmp_path / "refused_config"
    config.write_text(sshd.config.read_text().replace(f"Port {sshd.port}",
                                                      f"Port {free_port()}"))
    ssh = ssh_wrapper(tmp_path / "refused" / "ssh", config)
    proc = subprocess.run(
        session.ckpt_argv("launch", "--job-id", "ssh-refused", "--ckpt-dir", session.images,
                          "--", ssh, HOST, "true"),
        cwd=session.work, env=session.env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 255
    assert "Connection refused" in proc.stderr


def test_checkpoint_while_ssh_is_starting(session, sshd, tmp_path):
    """While ssh is still connecting, a checkpoint fails cleanly and the job
    goes on; the next one succeeds and restarts."""
    slow_ssh = ssh_wrapper(tmp_path / "slow" / "ssh", sshd.config, delay=2)
    # a job process execs it, so that ckpt-remote runs it, with its delay
    app = ["/bin/sh", "-c", f'exec {slow_ssh} {HOST} {APPS / "counter"} "$@"', "sh"]
    args = ["500", "10"]
    reference = session.reference(app, *args)
    job = Job(session, "ssh-slow", app, *args)
    deadline = time.monotonic() + 30
    while session.ckpt("status", job.id, check=False).returncode != 0:
        assert time.monotonic() < deadline, "the job never registered"
        time.sleep(0.05)
    failed = session.ckpt("checkpoint", job.id, check=False)
    assert failed.returncode != 0
    assert "being started through ssh" in failed.stderr
    job.wait_ready()
    job.checkpoint()
    job.kill()
    assert restart_and_finish(session, job.images[0], job) == reference


REMOTE_LAUNCH = {
    "mpich": lambda ssh: ["-launcher", "ssh", "-launcher-exec", ssh, "-hosts", HOST],
    "openmpi": lambda ssh: ["--mca", "plm_rsh_agent", ssh, "--host", f"{HOST}:4"],
}


@pytest.mark.parametrize("stack", ["mpich", "openmpi"])
def test_mpi_daemons_launched_through_ssh(session, sshd, stack):
    """mpirun starts its daemon (hydra_pmi_proxy, orted) on the "other"
    host through ssh: the ranks it starts there are part of the job."""
    if not have(stack):
        pytest.skip(f"{stack} is not installed")
    subprocess.run(["make", "-s", "-C", str(REPO / "integration" / "mpi")], check=True)
    app = MPIRUN[stack] + REMOTE_LAUNCH[stack](sshd.ssh) + [
        "-np", "2", str(MPI_BIN / stack / "ring")]
    checkpoint_kill_restart(session, f"ssh-{stack}", app, ["300", "10"])
