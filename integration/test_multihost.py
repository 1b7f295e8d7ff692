"""Multi-host jobs on the test cluster (cluster.py): MPI jobs whose ranks run
on two hosts join one job over TCP through each host's agent; a checkpoint
taken from any host covers every process of every host; connections that
do not prove the job's secret are refused and change nothing; a job
restarts on the same hosts, on other hosts and on the same hosts swapped,
and goes on to the result of an uninterrupted run.  A process stopped on
another host stays stopped through a checkpoint (its host's agent thaws
it); slot counts of a hostfile are checked before a restart starts; a
killed launcher's secret is removed by later commands."""
import json
import re
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness import REPO
from test_report_page import BROWSER, NO_BROWSER, PLOTS, all_drawn, browse, rows, seconds
from test_status import Terminal, events_of, validator
from test_mpi_verbs import COUNTER_COLUMN, COUNTERS

pytestmark = pytest.mark.multihost
CKPT = str(REPO / "bin" / "ckpt")
MPI_BIN = REPO / "integration" / "mpi" / "bin"
STACKS = ("openmpi", "mpich")
FINALIZE_WAIT = {  # after PASS, every rank is in MPI_Finalize
    "openmpi": 15,
    "mpich": 4,  # over UCX 1.13 it may hang there for good (openucx/ucx#8738)
}


class Job:
    """`ckpt launch -- mpirun ...` started on hosts[0] of the cluster."""

    def __init__(self, cluster, tmp_name, stack, hosts, program, args, np=4, mpirun_extra=()):
        self.cluster = cluster
        self.stack = stack
        self.id = f"{tmp_name[-30:].strip('_-')}-{stack}".replace("[", "-").replace("]", "")
        self.dir = cluster.shared_dir / self.id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, **cluster.mpi_env(stack),
                        CKPT_SHARED_STATE_DIR=str(cluster.shared_dir / "registry"))
        self.env.pop("XDG_RUNTIME_DIR", None)  # each host's own /tmp/ckpt-<uid>
        self.command = cluster.mpirun_args(stack, hosts, np) + list(mpirun_extra) + \
            [str(MPI_BIN / stack / program)] + [str(a) for a in args]
        self.launch_host = hosts[0]
        self.out = self.err = self.proc = None

    def _run(self, host, argv, name):
        """argv on host, its stdout through a pipe (outside the job: a
        restart gives the restored processes the restarter's) into a file."""
        out, err = self.dir / f"{name}.out", self.dir / f"{name}.err"
        shell = ["bash", "-c", 'set -o pipefail; "$@" | cat >> "$0"', str(out)]
        out.write_bytes(b"")
        with open(err, "wb") as sink:
            proc = self.cluster.popen(host, shell + argv, env=self.env, stderr=sink)
        self.proc, self.out, self.err = proc, out, err
        return proc

    def start(self):
        self._run(self.launch_host, [CKPT, "launch", "--job-id", self.id, "--ckpt-dir",
                                     str(self.dir / "img"), "--"] + self.command, "launch")
        self.wait_output("READY")
        return self

    def restart(self, checkpoint, hosts, name):
        """`ckpt restart --hosts ...` on the first of the new hosts (as a
        batch script runs on its allocation's first node)."""
        self._run(hosts[0], [CKPT, "restart", "--hosts", ",".join(hosts), str(checkpoint)], name)
        return self

    def ckpt(self, host, *args, check=True, timeout=120):
        r = self.cluster.run(host, [CKPT, *args], env=self.env, capture_output=True,
                             text=True, timeout=timeout)
        if check:
            assert r.returncode == 0, f"ckpt {' '.join(args)} on {host}: {r.stderr}"
        return r

    def status(self, host):
        return self.ckpt(host, "status", self.id).stdout

    def results(self):
        return [line for line in self.out.read_text().splitlines() if line.startswith("RESULT")]

    def wait_output(self, word, timeout=60):
        deadline = time.monotonic() + timeout
        while word not in self.out.read_text(errors="replace"):
            assert self.proc.poll() is None or word in self.out.read_text(errors="replace"), \
                f"job ended before {word!r}: {self.err.read_text(errors='replace')}"
            assert time.monotonic() < deadline, \
                f"no {word!r} within {timeout} s: {self.err.read_text(errors='replace')[-2000:]}"
            time.sleep(0.1)

    def finish(self, kill_host="h2"):
        """Waits for the job's end; MPICH over UCX 1.13 may hang in
        MPI_Finalize after its work (openucx/ucx#8738): then `ckpt kill`
        from another host ends it.  Returns the launcher's status."""
        self.wait_output("PASS", timeout=120)
        try:
            return self.proc.wait(timeout=FINALIZE_WAIT[self.stack])
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
    # the MPI programs' results depend on their steps alone: no pacing
    steps, _pace, *rest = args
    argv = cluster.mpirun_args(stack, ["h3", "h4"], 4) + [str(MPI_BIN / stack / program)] + \
        [str(a) for a in (steps, 0, *rest)]
    out = directory / "reference.out"
    with open(out, "wb") as sink:
        p = cluster.popen("h3", argv, env=env, stdout=sink, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while p.poll() is None and "PASS" not in out.read_text(errors="replace"):
            assert time.monotonic() < deadline, "the reference run did not finish"
            time.sleep(0.1)
        try:
            p.wait(timeout=FINALIZE_WAIT[stack])
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
    assert job.results() and job.results() == reference_result(cluster, stack, "ring", args, job.dir)


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
    # it listens where the other hosts reach it (h1's address), not on
    # every interface of h1
    port = address.rsplit(":", 1)[1]
    listening = cluster.run("h1", ["ss", "-Hltn", f"sport = :{port}"], capture_output=True,
                            text=True, timeout=30).stdout.split()
    assert f"{cluster.host('h1').address}:{port}" in listening, listening
    assert f"0.0.0.0:{port}" not in listening and f"*:{port}" not in listening, listening
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


def assert_nothing_left(cluster, hosts, wait=10):
    """Only sshd is left on hosts (killed processes get `wait` seconds to be
    reaped by the host's init)."""
    for host in hosts:
        deadline = time.monotonic() + wait
        while True:
            left = [p for p in cluster.processes(host)
                    if "sshd" not in _cmdline(p) and not _zombie(p)]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert not left, (host, [_cmdline(p) for p in left])


def _zombie(pid):
    """A process that ended and waits for its parent (sshd's session, say)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except (OSError, IndexError):
        return True


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace").replace("\0", " ")
    except OSError:
        return ""


def test_kill_from_another_host_ends_every_process(cluster, jobs, request):
    job = jobs(request.node.name, "openmpi", ["h1", "h2"], "ring", (100000, 20)).start()
    job.ckpt("h3", "kill", job.id)
    assert job.proc.wait(timeout=30) == 128 + 9
    assert_nothing_left(cluster, ("h1", "h2"))


def checkpoints_then_kill(job, rng, count=3):
    """count checkpoints at random moments, the last with --kill."""
    paths = []
    for i in range(count):
        time.sleep(rng.uniform(0.2, 1.0))
        extra = ["--kill"] if i == count - 1 else []
        paths.append(job.ckpt(job.cluster.names[1], "checkpoint", *extra, job.id).stdout.strip())
    assert job.proc.wait(timeout=30) != 0
    return paths


def wait_restored(job, host, timeout=120):
    """Until the restarted job's processes are all back (status lists them)."""
    deadline = time.monotonic() + timeout
    while True:
        r = job.ckpt(host, "status", job.id, check=False)
        if r.returncode == 0 and "restarted from" in r.stdout and "@" in r.stdout:
            return
        assert job.proc.poll() is None, job.err.read_text()
        assert time.monotonic() < deadline, "the restart did not come up"
        time.sleep(0.2)


@pytest.mark.parametrize("stack", STACKS)
def test_restart_on_same_other_and_swapped_hosts(cluster, jobs, request, stack, rng, tmp_path):
    """Three checkpoints, the last with --kill.  The first restarts on the
    same hosts and is checkpointed again (--kill) once restored; the last
    restarts on two other hosts, the new one on the same hosts swapped;
    both go on to the uninterrupted run's result.  A job that ends
    normally leaves its ports in TIME_WAIT for a minute: only runs ended by
    --kill (which resets their connections) are followed by a restart on
    their hosts, and the reference runs last.

    Ranks 0 and 2 (on different hosts) first talk in the ring's final
    MPI_Reduce: after a restart on other hosts that connection is made to
    the addresses the ranks exchanged at start-up, which the shim takes to
    the new hosts."""
    args = (300, 20)
    job = jobs(request.node.name, stack, ["h1", "h2"], "ring", args).start()
    first, _second, last = checkpoints_then_kill(job, rng)
    pause = job.dir / "paused"
    job.env["CKPT_PAUSE_BEFORE"] = f"PUBLISH:{pause}"  # armed below, for one checkpoint
    job.restart(first, ["h1", "h2"], "same")
    wait_restored(job, "h1")
    status_from_another_host(job, "h2", restarted_from=1, last=3)
    time.sleep(rng.uniform(0.2, 1.0))
    again = checkpoint_with_progress(job, pause, "h3")
    assert image_hosts(again) == ["h1", "h2"] and job.proc.wait(timeout=30) != 0
    results = {}
    for name, path, hosts in (("other", last, ["h3", "h4"]), ("swapped", again, ["h2", "h1"])):
        job.restart(path, hosts, name).finish()
        results[name] = job.results()
    expected = reference_result(cluster, stack, "ring", args, job.dir)
    assert results == {name: expected for name in results}
    logged = events_of(Path(first).parent)
    assert [(e["kind"], e["checkpoint"]) for e in logged] == [
        ("checkpoint", 1), ("checkpoint", 2), ("checkpoint", 3), ("restart", 1),
        ("checkpoint", 4), ("restart", 3), ("restart", 4)]
    for event in logged:
        if event["kind"] == "checkpoint":
            assert sorted(event["hosts"]) == ["h1", "h2"], event
            assert event["bytes"] == sum(h["bytes"] for h in event["hosts"].values())
    assert [e["hosts"] for e in logged if e["kind"] == "restart"] == [
        {"h1": "h1", "h2": "h2"}, {"h1": "h3", "h2": "h4"}, {"h1": "h2", "h2": "h1"}]
    inspect_both_hosts(job, first, last)
    report_of_both_hosts(job, Path(first).parent, logged, tmp_path)


def inspect_both_hosts(job, first, last):
    """`ckpt inspect --json` (from a host outside the job) of a checkpoint
    of both hosts: each process of the manifest, on its host, decoded; and
    --diff of two checkpoints of one run: the same processes."""
    def validated(name, *args):
        document = json.loads(job.ckpt("h3", "inspect", *args, "--json").stdout)
        validator(name).validate(document)
        return document
    found = validated("inspect", first)
    assert found["hosts"] == ["h1", "h2"] and found["job_id"] == job.id, found["hosts"]
    listed = {(p["host"], p["pid"]) for p in manifest_of(first)["processes"]}
    assert {(p["host"], p["pid"]) for p in found["processes"]} == listed
    assert {host for host, _ in listed} == {"h1", "h2"}
    for proc in found["processes"]:
        assert proc["threads"] and proc["exe"].startswith("/"), proc["exe"]
        assert sum(region["saved"] for region in proc["memory"]) > 0, (proc["host"], proc["pid"])
    ranks = [p for p in found["processes"] if p["exe"].endswith("/ring")]
    assert sorted(p["host"] for p in ranks) == ["h1", "h1", "h2", "h2"], \
        [(p["host"], p["exe"]) for p in found["processes"]]
    text = job.ckpt("h3", "inspect", first).stdout
    assert " on h1: " in text and " on h2: " in text, text
    changes = validated("inspect-diff", "--diff", first, last)
    assert changes["appeared"] == [] and changes["gone"] == []
    assert sorted([p["pid"] for p in changes["changed"]] + changes["unchanged"]) == \
        sorted(pid for _, pid in listed)


def report_of_both_hosts(job, job_dir, logged, tmp_path):
    """`ckpt report` of the job, opened in headless chromium: every chart
    drawn, and both hosts in the per-host and per-process charts and
    tables of the newest checkpoint, and in the bandwidth chart."""
    if BROWSER is None:
        pytest.skip(NO_BROWSER)
    page = job.dir / "report.html"
    made = job.ckpt("h3", "report", str(job_dir), "-o", str(page))
    assert made.stdout == f"{page}\n", made.stdout
    tree, console, drawn = browse(page, tmp_path)
    assert console == [], console
    all_drawn(tree, drawn, PLOTS)
    event = [e for e in logged if e["kind"] == "checkpoint"][-1]   # the one shown
    assert rows(tree, "table-hosts") == [
        [host, str(h["processes"]), str(h["bytes"]), seconds(h["stopped_s"]),
         seconds(h["write_s"]), seconds(h["flush_s"]) if "flush_s" in h else ""]
        for host, h in event["hosts"].items()]
    assert sorted(event["hosts"]) == ["h1", "h2"]

    def ticks(plot_id):
        return [t.all_text() for t in tree.by_id[plot_id].find_all("text")
                if "xtick" in (t.parent.attrs.get("class", "") if t.parent else "")]
    assert sorted(ticks("plot-hosts")) == ["h1", "h2"]
    processes = manifest_of(event["path"])["processes"]
    assert [row[:2] for row in rows(tree, "table-processes")] == \
        [[p["host"], str(p["pid"])] for p in processes]
    assert {p["host"] for p in processes} == {"h1", "h2"}
    assert sorted(ticks("plot-processes")) == sorted(f"{p['host']}:{p['pid']}" for p in processes)
    legend = [t.all_text() for t in tree.by_id["plot-bandwidth"].find_all("text", "legendtext")]
    assert sorted(legend) == ["h1 write", "h2 write"], legend


def status_from_another_host(job, host, restarted_from, last):
    """`ckpt status --json` from a host of the job other than its
    launcher's, checked against its schema."""
    document = json.loads(job.ckpt(host, "status", job.id, "--json").stdout)
    validator("status").validate(document)
    [described] = document["jobs"]
    assert described["hosts"] == ["h1", "h2"] and described["restarted_from"] == restarted_from
    assert described["last_checkpoint"]["checkpoint"] == last
    assert described["launcher_host"] == "h1"


def checkpoint_with_progress(job, pause, host):
    """`ckpt checkpoint --kill` on a terminal of host, held before its
    publication: the progress shows the phase and a line for each host."""
    pause.with_name("paused.arm").touch()
    shown = Terminal(job.cluster.enter_argv(host) + [CKPT, "checkpoint", "--kill", job.id],
                     job.env)
    deadline = time.monotonic() + 120
    while not pause.exists():
        assert time.monotonic() < deadline and shown.proc.poll() is None, shown.seen[-2000:]
        time.sleep(0.02)
    shown.read_until([b"publishing", b"  h1 ", b"  h2 "])
    pause.unlink()
    assert shown.finish() == 0, shown.seen[-2000:]
    return re.findall(r"/\S+/ckpt-\d{4}", shown.seen.decode(errors="replace"))[-1]


def test_restart_chain_across_three_host_sets(cluster, jobs, request, rng):
    args = (400, 20)
    job = jobs(request.node.name, "openmpi", ["h1", "h2"], "ring", args).start()
    path = checkpoints_then_kill(job, rng, count=1)[0]
    for hosts in (["h3", "h4"], ["h2", "h3"]):
        job.restart(path, hosts, "-".join(hosts))
        wait_restored(job, hosts[0])
        time.sleep(rng.uniform(0.2, 1.0))
        path = job.ckpt(hosts[1], "checkpoint", "--kill", job.id).stdout.strip()
        assert image_hosts(path) == sorted(hosts), path
        assert job.proc.wait(timeout=30) != 0
    job.restart(path, ["h4", "h1"], "h4-h1").finish()
    assert job.results() == reference_result(cluster, "openmpi", "ring", args, job.dir)


def test_restart_on_unreachable_or_too_few_hosts_fails_clearly(cluster, jobs, request):
    job = jobs(request.node.name, "openmpi", ["h1", "h2"], "ring", (100000, 20)).start()
    path = job.ckpt("h2", "checkpoint", "--kill", job.id).stdout.strip()
    job.proc.wait(timeout=30)
    r = job.ckpt("h1", "restart", "--hosts", "h3", path, check=False)
    assert r.returncode == 2 and "2 hosts" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = job.ckpt("h1", "restart", "--hosts", "h3,nosuchhost", path, check=False)
    assert r.returncode == 2 and "nosuchhost" in r.stderr and "Traceback" not in r.stderr, r.stderr
    # a host whose name resolves, where nothing answers
    hosts_file = cluster.dir / "hosts"
    original = hosts_file.read_text()
    ghost = cluster.subnet.rsplit(".", 1)[0] + ".99"
    hosts_file.write_text(original + f"{ghost} ghost\n")
    try:
        r = job.ckpt("h1", "restart", "--hosts", "h3,ghost", path, check=False, timeout=180)
    finally:
        hosts_file.write_text(original)
    assert r.returncode != 0 and "ghost" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert_nothing_left(cluster, cluster.names)   # the part restored on h3 is gone too


def test_host_that_dies_during_a_checkpoint(cluster, jobs, request):
    """h2 hangs in the middle of a checkpoint (every process of it stopped,
    its agent too), then dies.  The checkpoint fails naming h2, the previous
    checkpoint stays the latest and whole, h1's processes are resumed; the
    MPI job then ends as Open MPI ends a job that lost a node, and nothing
    is left on any host."""
    import signal
    sys.path.insert(0, str(REPO))
    from ckpt.image import verify_checkpoint

    job = jobs(request.node.name, "openmpi", ["h1", "h2"], "ring", (100000, 20)).start()
    first = Path(job.ckpt("h1", "checkpoint", job.id).stdout.strip())
    for pid in cluster.processes("h2"):
        if "sshd" not in _cmdline(pid):
            os.kill(pid, signal.SIGSTOP)
    second = cluster.popen("h1", [CKPT, "checkpoint", job.id], env=job.env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)          # it waits for h2 now
    assert second.poll() is None
    cluster.kill_all("h2")
    out, err = second.communicate(timeout=60)
    assert second.returncode != 0 and "h2" in err and "Traceback" not in err, (out, err)
    job_dir = first.parent
    assert os.readlink(job_dir / "latest") == first.name
    assert not [p for p in job_dir.iterdir() if p.name.startswith(".ckpt-")]
    verify_checkpoint(first, checksum=True)
    assert job.proc.wait(timeout=60) != 0
    assert_nothing_left(cluster, ("h1", "h2"))


UD_MESH = REPO / "integration" / "ib" / "bin" / "ud_mesh"
MESH_SCRIPT = """
# 4 ranks of ud_mesh: 2 here, 2 on $2 through ssh; they meet in files in $1
D=$1; B=$2; R=$3
mkdir -p $D
E="LD_LIBRARY_PATH=$SOFTVERBS SOFTVERBS_DIR=$FABRIC CKPT_IB_DEBUG=1"
for rank in 0 1; do env $E $MESH --rank $rank --of 4 --dir $D $R 2 & done
for rank in 2 3; do ssh $B env $E $MESH --rank $rank --of 4 --dir $D $R 2 & done
wait
"""


def mesh_results(text):
    return sorted(re.findall(r"rank (\d+) of 4, \d+ rounds, ([0-9a-f]{16})", text))


def test_ud_mesh_over_softverbs_restarted_on_two_other_hosts(cluster, jobs, request):
    """Every rank sends to every other over UD (softverbs' UDP transport
    between hosts, an address handle per peer); checkpointed on h1, h2 and
    restarted on h3, h4: new adapters, new LIDs and QPNs on new hosts,
    which the IB plugin exchanges through the coordinator.  Each rank checks
    that every message came exactly once, in order and intact."""
    subprocess.run(["make", "-s", "-C", str(REPO / "native" / "softverbs")], check=True)
    subprocess.run(["make", "-s", "-C", str(REPO / "integration" / "ib")], check=True)
    job = jobs(request.node.name, "openmpi", ["h1", "h2"], "ring", ())  # its own command below
    script = job.dir / "mesh.sh"
    script.write_text(MESH_SCRIPT)
    job.env.update(SOFTVERBS=str(REPO / "native" / "softverbs"), FABRIC=str(job.dir / "fabric"),
                   MESH=str(UD_MESH))
    rounds = "2500"
    job._run("h1", [CKPT, "launch", "--job-id", job.id, "--ckpt-dir", str(job.dir / "img"),
                    "--", "bash", str(script), str(job.dir / "meet"), "h2", rounds], "launch")
    job.wait_output("READY 3")
    time.sleep(1.0)
    path = job.ckpt("h3", "checkpoint", "--kill", job.id).stdout.strip()
    assert image_hosts(path) == ["h1", "h2"]
    assert job.proc.wait(timeout=30) != 0
    job.restart(path, ["h3", "h4"], "moved")
    deadline = time.monotonic() + 120
    while len(mesh_results(job.out.read_text())) < 4:
        assert job.proc.poll() is None, job.err.read_text()
        assert time.monotonic() < deadline, "the restarted mesh did not finish"
        time.sleep(0.2)
    assert job.proc.wait(timeout=30) == 0, job.err.read_text()
    moved = job.out.read_text()
    # the ranks' stderr is the launcher's file (restored as it was)
    said = (job.dir / "launch.err").read_text()
    rebuilt = re.findall(r"QP (0x[0-9a-f]+) is now (0x[0-9a-f]+) on LID (0x[0-9a-f]+)", said)
    assert len(rebuilt) == 4, said          # every rank's QP, each on a new adapter
    created = re.findall(r"READY|", said)
    assert created
    # the same mesh, uninterrupted, on h3 and h4
    reference = subprocess.run(
        cluster.enter_argv("h3") + ["bash", str(script), str(job.dir / "meet-ref"), "h4", rounds],
        env=job.env, capture_output=True, text=True, timeout=300)
    assert reference.returncode == 0, reference.stderr
    assert mesh_results(moved) == mesh_results(reference.stdout) and len(mesh_results(moved)) == 4


# MPI over verbs across hosts: each host's ranks on their own softverbs
# adapter, the hosts' adapters linked by softverbs' UDP transport.
# transport -> (environment, Open MPI's mpirun arguments, the QP type
# that must carry the traffic)
UCX_ON_VERBS = {"UCX_UD_TIMEOUT": "10m"}  # see test_mpi_verbs: old images
VERBS_TRANSPORTS = {
    "ud_verbs": ({"UCX_TLS": "ud_verbs,self", **UCX_ON_VERBS}, ["--mca", "pml", "ucx"], "ud"),
    "rc_v": ({"UCX_TLS": "rc_v,self", **UCX_ON_VERBS}, ["--mca", "pml", "ucx"], "rc"),
    "openib": ({}, ["--mca", "pml", "ob1", "--mca", "btl", "openib,self",
                    "--mca", "btl_openib_allow_ib", "1",
                    "--mca", "btl_openib_warn_no_device_params_found", "0"], "rc"),
}


def verbs_job(cluster, jobs, request, stack, transport, args):
    """A 4-rank ring on h1, h2 over softverbs (MPICH's hydra passes its
    environment to the remote ranks; Open MPI is told which with -x)."""
    subprocess.run(["make", "-s", "-C", str(REPO / "native" / "softverbs")], check=True)
    env, openmpi_args, _ = VERBS_TRANSPORTS[transport]
    directory = cluster.shared_dir / f"verbs-{stack}-{transport}"
    env = dict(env, LD_LIBRARY_PATH=str(REPO / "native" / "softverbs"),
               SOFTVERBS_DIR=str(directory / "fabric"),
               SOFTVERBS_DEBUG=str(directory / "counters"), CKPT_IB_DEBUG="1")
    extra = []
    if stack == "openmpi":
        extra = openmpi_args + [x for name in env for x in ("-x", name)]
    job = jobs(request.node.name, stack, ["h1", "h2"], "ring", args, mpirun_extra=extra)
    job.env.update(env)
    job.counters = Path(env["SOFTVERBS_DEBUG"])
    return job


def restart_over_verbs(job, path, hosts, name, qp_type):
    """Restarts path on hosts, to the job's end; returns its RESULT lines.
    Every restarted rank must have gone on over QPs of qp_type of the
    adapter the IB plugin rebuilt (softverbs' counters, one line per
    process at its close: the old adapter's QPs are gone with the old
    process)."""
    counted = job.counters.stat().st_size
    job.restart(path, hosts, name).finish()
    # pids repeat across hosts: one line per process, not one per pid
    after = [int(c[1 + COUNTER_COLUMN[qp_type]]) for c in
             COUNTERS.findall(job.counters.read_text()[counted:])]
    assert len(after) == 4 and min(after) > 0, \
        f"{qp_type} WRs of the ranks restarted on {hosts}: {after}"
    return job.results()


@pytest.mark.parametrize("stack,transport", [("mpich", "ud_verbs"), ("mpich", "rc_v"),
                                             ("openmpi", "ud_verbs"), ("openmpi", "openib")])
def test_mpi_over_verbs_restarted_on_two_other_hosts(cluster, jobs, request, rng, stack,
                                                     transport):
    """2 ranks on each of h1, h2, over verbs: three checkpoints at random
    moments (the last with --kill); the first image restarts on h3, h4 (new
    adapters, LIDs, QPNs and keys on new hosts, exchanged by the IB plugin
    through the coordinator), the last on h2, h1; both go on to the result
    of an uninterrupted run."""
    args = (300, 20)
    job = verbs_job(cluster, jobs, request, stack, transport, args).start()
    first, _second, last = checkpoints_then_kill(job, rng)
    qp_type = VERBS_TRANSPORTS[transport][2]
    results = {"moved": restart_over_verbs(job, first, ["h3", "h4"], "moved", qp_type),
               "swapped": restart_over_verbs(job, last, ["h2", "h1"], "swapped", qp_type)}
    # the ranks' stderr: the launcher's file, where the restored ranks
    # write on at their checkpointed offsets
    said = (job.dir / "launch.err").read_text()
    assert len(re.findall(r"QP 0x[0-9a-f]+ is now 0x[0-9a-f]+ on LID", said)) >= 4, said[-2000:]
    expected = reference_result(cluster, stack, "ring", args, job.dir)
    assert results == {name: expected for name in results}


def host_processes(cluster, host, name):
    """{pid in host's own namespace: state letter} of host's processes
    running program name (by their command line: a restored process's
    comm is ckpt-restart's)."""
    r = cluster.run(host, ["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    procs = {}
    for line in r.stdout.splitlines():
        pid, state, args = line.split(None, 2)
        if os.path.basename(args.split()[0]) == name:
            procs[int(pid)] = state[0]
    return procs


def wait_state(cluster, host, name, state, timeout=60):
    """The pid of the first of host's processes called name in state."""
    deadline = time.monotonic() + timeout
    while True:
        found = [pid for pid, s in host_processes(cluster, host, name).items() if s == state]
        if found:
            return found[0]
        assert time.monotonic() < deadline, (host, name, cluster.run(
            host, ["ps", "-eo", "pid,ppid,stat,comm,args"], capture_output=True, text=True).stdout)
        time.sleep(0.1)


def test_stopped_rank_on_another_host_stays_stopped_through_checkpoint_and_restart(
        cluster, jobs, request):
    """A rank on h2 stopped from inside h2 (kill -STOP): h2's agent thaws it
    for the checkpoint and stops it again; it is still stopped afterwards,
    and once continued the job ends with the uninterrupted run's result.
    Restarted on h3, h4, the rank comes back stopped on h4 (as on one
    host) and, continued there, the job ends with the same result."""
    args = (300, 20)
    job = jobs(request.node.name, "openmpi", ["h1", "h2"], "ring", args).start()
    ranks = host_processes(cluster, "h2", "ring")
    assert len(ranks) == 2 and set(ranks.values()) <= {"R", "S"}, ranks
    victim = min(ranks)
    assert cluster.run("h2", ["kill", "-STOP", str(victim)]).returncode == 0
    assert wait_state(cluster, "h2", "ring", "T") == victim
    path = job.ckpt("h3", "checkpoint", job.id).stdout.strip()
    assert image_hosts(path) == ["h1", "h2"]
    assert host_processes(cluster, "h2", "ring")[victim] == "T"   # not "t": no tracer left
    assert job.proc.poll() is None and "PASS" not in job.out.read_text()
    assert cluster.run("h2", ["kill", "-CONT", str(victim)]).returncode == 0
    job.finish()
    finished = job.results()
    job.restart(path, ["h3", "h4"], "moved")
    wait_restored(job, "h3")
    stopped = wait_state(cluster, "h4", "ring", "T")
    assert list(host_processes(cluster, "h4", "ring").values()).count("T") == 1
    assert "PASS" not in job.out.read_text()
    assert cluster.run("h4", ["kill", "-CONT", str(stopped)]).returncode == 0
    job.finish()
    expected = reference_result(cluster, "openmpi", "ring", args, job.dir)
    assert {"finished": finished, "moved": job.results()} == \
        {"finished": expected, "moved": expected}


def test_restart_hostfile_slots_must_hold_the_old_hosts_processes(cluster, jobs, request):
    """--hostfile lines `host slots=N` and `host:N`: a slot is one process of
    the checkpoint (docs/DESIGN.md).  A host with fewer slots than the
    host it replaces had processes is refused in one line naming it, exit
    status 2, before anything starts; with enough, the job restarts and
    ends with the uninterrupted run's result."""
    args = (300, 20)
    job = jobs(request.node.name, "openmpi", ["h1", "h2"], "ring", args).start()
    path = job.ckpt("h2", "checkpoint", "--kill", job.id).stdout.strip()
    job.proc.wait(timeout=30)
    counts = {host: 0 for host in ("h1", "h2")}
    for proc in manifest_of(path)["processes"]:
        counts[proc["host"]] += 1
    assert counts["h2"] > 2   # two ranks and Open MPI's daemon at least
    hostfile = job.dir / "hostfile"
    for text, refused in ((f"h3 slots={counts['h1']}\nh4:{counts['h2'] - 1}\n", "host h4 "),
                          (f"h3:{counts['h1'] - 1}   # too few\nh4\n", "host h3 "),
                          ("h3 slots=two\nh4\n", "line 1")):
        hostfile.write_text(text)
        r = job.ckpt("h3", "restart", "--hostfile", str(hostfile), path, check=False)
        assert r.returncode == 2 and refused in r.stderr, (text, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert_nothing_left(cluster, cluster.names)
        assert not list(Path(path).parent.glob(".secret-*"))
    hostfile.write_text(f"# new hosts\nh3 slots={counts['h1']} max_slots=64\nh4:{counts['h2']}\n")
    job._run("h3", [CKPT, "restart", "--hostfile", str(hostfile), path], "slots")
    job.finish()
    assert job.results() == reference_result(cluster, "openmpi", "ring", args, job.dir)


def test_a_killed_launchers_secret_is_removed_by_a_later_command(cluster, jobs, request):
    """A launcher killed by SIGKILL leaves its secret (`.secret-<host>-<pid>`)
    and registry entries.  Its job id launched again from another host
    (whose coordinator's port on the dead launcher's host is refused) or
    `ckpt list` on the launcher's own host removes them; a live job's
    secret survives every command of other hosts, and its id is refused."""
    job = jobs(request.node.name, "openmpi", ["h1"], "ring", ())   # dirs and environment
    registry = cluster.shared_dir / "registry" / f"{job.id}.json"
    job_dir = job.dir / "img" / job.id

    def launch(host):
        job._run(host, [CKPT, "launch", "--job-id", job.id, "--ckpt-dir", str(job.dir / "img"),
                        "--", "sleep", "600"], f"launch-{host}")
        deadline = time.monotonic() + 60
        while True:
            entry = json.loads(registry.read_text()) if registry.exists() else {}
            if entry.get("host") == host and os.path.exists(entry["secret_file"]):
                job.ckpt("h4", "status", job.id)   # its secret works from another host
                return entry
            assert job.proc.poll() is None, job.err.read_text()
            assert time.monotonic() < deadline, "the job did not register"
            time.sleep(0.1)

    def kill_launcher(host, entry):
        sleeps = list(host_processes(cluster, host, "sleep"))
        assert len(sleeps) == 1, sleeps
        for pid in (entry["launcher_pid"], sleeps[0]):
            assert cluster.run(host, ["kill", "-KILL", str(pid)]).returncode == 0
        assert job.proc.wait(timeout=30) != 0
        assert os.path.exists(entry["secret_file"]) and registry.exists()

    def secrets():
        return sorted(p.name for p in job_dir.glob(".secret-*"))

    first = launch("h2")
    kill_launcher("h2", first)
    second = launch("h1")   # h2's coordinator is gone: its port is refused
    assert secrets() == [os.path.basename(second["secret_file"])], secrets()
    kill_launcher("h1", second)
    job.ckpt("h3", "list")  # h3 cannot tell: h1's entry and secret stay
    assert secrets() == [os.path.basename(second["secret_file"])]
    job.ckpt("h1", "list")  # h1 can
    assert secrets() == [] and not registry.exists()

    live = launch("h2")
    for host in ("h1", "h3"):
        job.ckpt(host, "list")
    r = job.ckpt("h3", "launch", "--job-id", job.id, "--ckpt-dir", str(job.dir / "img"),
                 "--", "true", check=False)
    assert r.returncode != 0 and "already running" in r.stderr and "on h2" in r.stderr, r.stderr
    assert secrets() == [os.path.basename(live["secret_file"])]
    job.ckpt("h4", "status", job.id)
    job.ckpt("h3", "kill", job.id)
    job.proc.wait(timeout=30)
    assert secrets() == [] and not registry.exists()
