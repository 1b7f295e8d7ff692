"""Multi-host jobs on the test cluster (cluster.py): MPI jobs whose ranks run
on two hosts join one job over TCP through each host's agent; a checkpoint
taken from any host covers every process of every host; connections that
do not prove the job's secret are refused and change nothing."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness import REPO

pytestmark = pytest.mark.multihost
CKPT = str(REPO / "bin" / "ckpt")
MPI_BIN = REPO / "integration" / "mpi" / "bin"
STACKS = ("openmpi", "mpich")
FINALIZE_WAIT = 15  # after PASS, every rank is in MPI_Finalize


class Job:
    """`ckpt launch -- mpirun ...` started on hosts[0] of the cluster."""

    def __init__(self, cluster, tmp_name, stack, hosts, program, args, np=4):
        self.cluster = cluster
        self.stack = stack
        self.id = f"{tmp_name[-30:].strip('_-')}-{stack}".replace("[", "-").replace("]", "")
        self.dir = cluster.shared_dir / self.id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, **cluster.mpi_env(stack),
                        CKPT_SHARED_STATE_DIR=str(cluster.shared_dir / "registry"))
        self.env.pop("XDG_RUNTIME_DIR", None)  # each host's own /tmp/ckpt-<uid>
        self.command = cluster.mpirun_args(stack, hosts, np) + \
            [str(MPI_BIN / stack / program)] + [str(a) for a in args]
        self.launch_host = hosts[0]
        self.out = self.dir / "out"
        self.err = self.dir / "err"
        self.proc = None

    def start(self):
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = self.cluster.popen(
                self.launch_host, [CKPT, "launch", "--job-id", self.id, "--ckpt-dir",
                                   str(self.dir / "img"), "--"] + self.command,
                env=self.env, stdout=out, stderr=err)
        self.wait_output("READY")
        return self

    def ckpt(self, host, *args, check=True, timeout=120):
        r = self.cluster.run(host, [CKPT, *args], env=self.env, capture_output=True,
                             text=True, timeout=timeout)
        if check:
            assert r.returncode == 0, f"ckpt {' '.join(args)} on {host}: {r.stderr}"
        return r

    def status(self, host):
        return self.ckpt(host, "status", self.id).stdout

    def wait_output(self, word, timeout=60):
        deadline = time.monotonic() + timeout
        while word not in self.out.read_text(errors="replace"):
            assert self.proc.poll() is None or word in self.out.read_text(errors="replace"), \
                f"job ended before {word!r}: {self.err.read_text(errors='replace')}"
            assert time.monotonic() < deadline, f"no {word!r} within {timeout} s"
            time.sleep(0.1)

    def finish(self, kill_host="h2"):
        """Waits for the job's end; MPICH over UCX 1.13 may hang in
        MPI_Finalize after its work (openucx/ucx#8738): then `ckpt kill`
        from another host ends it.  Returns the launcher's status."""
        self.wait_output("PASS", timeout=120)
        try:
            return self.proc.wait(timeout=FINALIZE_WAIT)
        except subprocess.TimeoutExpired:
            assert self.stack == "mpich", "Open MPI job did not exit"
            self.ckpt(kill_host, "kill", self.id)
            return self.proc.wait(timeout=30)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.ckpt(self.launch_host, "kill", self.id, check=False)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def jobs(cluster):
    started = []

    def make(*args, **kw):
        job = Job(cluster, *args, **kw)
        started.append(job)
        return job
    yield make
    for job in started:
        job.stop()
    for host in cluster.names:   # whatever a failure left behind
        cluster.kill_all(host)


def reference_result(cluster, stack, program, args, directory):
    """The RESULT line of an uninterrupted run of the same job on h3, h4."""
    env = dict(os.environ, **cluster.mpi_env(stack))
    argv = cluster.mpirun_args(stack, ["h3", "h4"], 4) + [str(MPI_BIN / stack / program)] + \
        [str(a) for a in args]
    out = directory / "reference.out"
    with open(out, "wb") as sink:
        p = cluster.popen("h3", argv, env=env, stdout=sink, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while p.poll() is None and "PASS" not in out.read_text(errors="replace"):
            assert time.monotonic() < deadline, "the reference run did not finish"
            time.sleep(0.1)
        try:
            p.wait(timeout=FINALIZE_WAIT)
        except subprocess.TimeoutExpired:
            assert stack == "mpich", "Open MPI job did not exit"   # see Job.finish
    finally:
        for host in ("h3", "h4"):
            cluster.kill_all(host)
        p.wait()
    return [line for line in out.read_text().splitlines() if line.startswith("RESULT")]


def manifest_of(path):
    return yaml.safe_load((Path(path) / "manifest.yaml").read_text())


def image_hosts(path):
    return sorted({p.name.split("-")[0] for p in Path(path).glob("*.img")})


@pytest.mark.parametrize("stack", STACKS)
def test_checkpoint_from_any_host_covers_every_host(cluster, jobs, request, stack):
    args = (300, 20)
    job = jobs(request.node.name, stack, ["h1", "h2"], "ring", args).start()
    # the remote host's processes reached the coordinator through their agent
    status = job.status("h2")
    assert "@h2" in status and "@h1" in status, status
    assert cluster.cross_host_unix_connections() == []
    first = job.ckpt("h2", "checkpoint", job.id).stdout.strip()
    second = job.ckpt("h3", "checkpoint", job.id).stdout.strip()
    job.finish()
    assert "refused" not in job.err.read_text()
    for path in (first, second):
        assert image_hosts(path) == ["h1", "h2"], path
        hosts = {p["host"] for p in manifest_of(path)["processes"]}
        assert hosts == {"h1", "h2"}
    ours = [line for line in job.out.read_text().splitlines() if line.startswith("RESULT")]
    assert ours and ours == reference_result(cluster, stack, "ring", args, job.dir)


def _raw_connection(cluster, host, address, first_lines):
    """What a coordinator answers to a connection from `host` that sends
    first_lines (no handshake of ours): its lines until it closes."""
    script = ("import socket, sys\n"
              "h, p = sys.argv[1].rsplit(':', 1)\n"
              "s = socket.create_connection((h, int(p)), timeout=20)\n"
              "s.sendall(sys.argv[2].encode())\n"
              "data = b''\n"
              "while True:\n"
              "    b = s.recv(4096)\n"
              "    if not b: break\n"
              "    data += b\n"
              "sys.stdout.write(data.decode(errors='replace'))\n")
    r = cluster.run(host, [sys.executable, "-c", script, address, first_lines],
                    capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_connections_without_the_secret_are_refused(cluster, jobs, request):
    job = jobs(request.node.name, "openmpi", ["h1", "h2"], "ring", (300, 20)).start()
    entry = json.loads((cluster.shared_dir / "registry" / f"{job.id}.json").read_text())
    address = entry["address"]
    assert entry["host"] == "h1" and os.stat(entry["secret_file"]).st_mode & 0o777 == 0o600
    # no handshake at all: an agent's and a client's first lines
    answer = _raw_connection(cluster, "h3", address, "AGENT h3 1\nCLIENT KILL\n")
    assert answer.startswith("CHALLENGE ") and "AUTH-FAIL" in answer and "WELCOME" not in answer
    # a handshake with the wrong secret
    wrong = cluster.shared_dir / f"{job.id}-wrong-secret"
    wrong.write_bytes(os.urandom(32))
    os.chmod(wrong, 0o600)
    fake = dict(entry, secret_file=str(wrong), job_id=job.id)
    fake_registry = cluster.shared_dir / "registry-wrong"
    fake_registry.mkdir(mode=0o700, exist_ok=True)
    (fake_registry / f"{job.id}.json").write_text(json.dumps(fake))
    r = cluster.run("h4", [CKPT, "kill", job.id], capture_output=True, text=True, timeout=60,
                    env=dict(job.env, CKPT_SHARED_STATE_DIR=str(fake_registry)))
    assert r.returncode != 0 and "secret" in r.stderr and "Traceback" not in r.stderr, r.stderr
    # the job noticed nothing: it is still whole, and checkpoints
    assert job.proc.poll() is None
    path = job.ckpt("h2", "checkpoint", job.id).stdout.strip()
    assert image_hosts(path) == ["h1", "h2"]
    job.finish()
    refused = [line for line in job.err.read_text().splitlines() if "refused a connection" in line]
    assert len(refused) == 2, job.err.read_text()


def test_kill_from_another_host_ends_every_process(cluster, jobs, request):
    job = jobs(request.node.name, "openmpi", ["h1", "h2"], "ring", (100000, 20)).start()
    job.ckpt("h3", "kill", job.id)
    assert job.proc.wait(timeout=30) == 128 + 9
    for host in ("h1", "h2"):
        deadline = time.monotonic() + 10
        while True:   # sshd is all that may be left (and the agent, on its way out)
            left = [p for p in cluster.processes(host)
                    if "sshd" not in Path(f"/proc/{p}/cmdline").read_text(errors="replace")]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert not left, (host, [Path(f"/proc/{p}/cmdline").read_text() for p in left])
