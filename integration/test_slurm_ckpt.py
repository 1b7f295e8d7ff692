"""Batch jobs under `ckpt slurm run` on real Slurm daemons (slurm_cluster.py),
with the project's prolog, epilog and task prolog: USR1 checkpoints and
requeues the job, which restarts on other nodes of its new allocation
(twice in one job); a time limit's USR1; a requeue (preemption) restarts
from the latest periodic checkpoint; a node that dies gets the job
requeued by Slurm and restarted on the nodes left.  Every job ends with
the result of an uninterrupted run, and after each one no job process,
node-local directory or drained node is left, and every checkpoint is
still there."""
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from cluster import kill_pids
from harness import REPO
from test_report_page import BROWSER, NO_BROWSER, PLOTS, all_drawn, browse, rows
from test_status import events_of, validator

pytestmark = [pytest.mark.multihost, pytest.mark.slurm]
CKPT = str(REPO / "bin" / "ckpt")
MPI_BIN = REPO / "integration" / "mpi" / "bin"
STACKS = ("openmpi", "mpich")
EXAMPLE = REPO / "examples" / "slurm" / "ckpt-job.sh"
STAGE = "/dev/shm/ckpt-stage"   # node-local on each namespace host
FINALIZE_WAIT = 15   # MPICH over UCX may hang in MPI_Finalize (openucx/ucx#8738)


def registry(slurm):
    """The jobs' shared registry: ckpt's commands find a job there from any node."""
    return slurm.cluster.shared_dir / "registry"


def ckpt_env(slurm):
    return slurm.slurm_env(CKPT_SHARED_STATE_DIR=str(registry(slurm)))


def mpirun(slurm, stack):
    """mpirun inside an allocation: it launches through srun (no ssh)."""
    if stack == "mpich":
        return ["mpirun.mpich", "-np", "4"]
    subnet = slurm.cluster.subnet
    return ["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "-np", "4",
            "-x", "ZDTM_HOLD",
            "--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet]


class BatchJob:
    """A 2-node batch job whose script ends in `exec ckpt slurm run -- mpirun ...`.
    Its programs wait after their steps while the hold file exists
    (zdtm_hold), so that few steps outlast any requeue: finish() lets
    them end."""

    def __init__(self, slurm, directory, stack, args, ckpt_options=(), sbatch_options=(),
                 command=None, example=False):
        """example: submit examples/slurm/ckpt-job.sh with the command as
        its arguments, as a user would (its settings in the environment),
        instead of a script of the test's own."""
        self.slurm, self.dir, self.stack, self.args = slurm, directory, stack, args
        directory.mkdir(parents=True, exist_ok=True)
        self.out = directory / "job.out"
        self.img = directory / "img"
        self.hold = directory / "hold"
        self.hold.touch()
        if command is None:
            command = mpirun(slurm, stack) + [str(MPI_BIN / stack / "ring")] + \
                [str(a) for a in args]
        if example:
            assert not ckpt_options
            self.sbatch = [f"--export=ALL,CKPT_DIR={self.img},"
                           f"CKPT_SHARED_STATE_DIR={registry(slurm)},ZDTM_HOLD={self.hold},"
                           f"PATH={REPO / 'bin'}:{os.environ['PATH']}",
                           "-o", str(self.out), *sbatch_options, str(EXAMPLE), *command]
            return
        script = directory / "job.sh"
        script.write_text(
            "#!/bin/sh\n"
            f"export CKPT_SHARED_STATE_DIR={registry(slurm)}\n"
            f"export ZDTM_HOLD={self.hold}\n"
            f"exec {CKPT} slurm run --ckpt-dir {self.img} {' '.join(ckpt_options)} -- "
            + " ".join(command) + "\n")
        os.chmod(script, 0o755)
        self.sbatch = ["-N", "2", "--ntasks-per-node=2", "--requeue", "--open-mode=append",
                       "-o", str(self.out), *sbatch_options, str(script)]
        self.id = None

    def submit(self, exclude=("h3", "h4")):
        self.id = self.slurm.sbatch("h1", [f"--exclude={','.join(exclude)}"] + self.sbatch)
        return self

    def text(self):
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def results(self):
        return [line for line in self.text().splitlines() if line.startswith("RESULT")]

    def checkpoints(self):
        return sorted(p.name for p in (self.img / self.id).glob("ckpt-*"))

    def checkpoints_named(self):
        """The checkpoints the job's output says it wrote or restarted from."""
        paths = []
        for line in self.text().splitlines():
            for marker in (": checkpoint /", "restarting from /"):
                if line.startswith("ckpt: job") and marker in line:
                    path = line.split(marker, 1)[1].strip()
                    # "checkpoint PATH (SIZE in T s)": the path without its figures
                    paths.append("/" + re.sub(r" \([^()]* in [0-9.]+ s\)$", "", path))
        return paths

    def wait_text(self, word, count=1, timeout=120):
        deadline = time.monotonic() + timeout
        while self.text().count(word) < count:
            state = self.slurm.job(self.id) or {}
            assert state.get("JobState") not in ("FAILED", "CANCELLED", "COMPLETED"), \
                f"job ended before {word!r} x{count}: {self.text()}"
            assert time.monotonic() < deadline, \
                f"no {word!r} x{count} within {timeout} s: {self.text()}\n{self.slurm.logs()}"
            time.sleep(0.1)

    def wait_checkpoints(self, count, timeout=60):
        """Until count periodic checkpoints are there."""
        deadline = time.monotonic() + timeout
        while len(self.checkpoints()) < count:
            assert time.monotonic() < deadline, f"no {count} periodic checkpoints: {self.text()}"
            time.sleep(0.2)

    def usr1(self):
        self.slurm.check("h1", ["scancel", "--signal=USR1", "--batch", self.id])

    def wait_pending(self, restarts):
        return self.slurm.wait_job(self.id, ("PENDING",),
                                   until=lambda j: j.get("Restarts") == str(restarts))

    def keep_off(self, hosts):
        """While pending: the next allocation avoids hosts."""
        self.slurm.check("h1", ["scontrol", "update", f"JobId={self.id}",
                                f"ExcNodeList={','.join(hosts)}"])

    def wait_running(self, restarts):
        job = self.slurm.wait_job(self.id, ("RUNNING",), timeout=120,
                                  until=lambda j: j.get("Restarts") == str(restarts))
        return self.nodes(job)

    def nodes(self, job):
        return self.slurm.check("h1", ["scontrol", "show", "hostnames",
                                       job["NodeList"]]).split()

    def requeue_along(self, moves):
        """USR1 (checkpoint and requeue) once per (away, to) of moves: the
        requeued job is kept off away, runs on to, and is restored there."""
        for restarts, (away, to) in enumerate(moves, start=1):
            time.sleep(2)
            self.usr1()
            self.wait_pending(restarts)
            self.keep_off(away)
            assert self.wait_running(restarts) == to
            self.wait_text(f"ckpt: job {self.id}\n", count=restarts + 1)   # restored

    def release(self):
        """The programs end once their steps are done."""
        self.hold.unlink(missing_ok=True)

    def finish(self, timeout=180):
        """Until the job ended; an MPICH job hung in MPI_Finalize after PASS
        is ended with `ckpt kill`.  Returns the final JobState."""
        self.release()
        self.wait_text("PASS", timeout=timeout)
        try:
            return self.slurm.wait_job(self.id, ("COMPLETED", "FAILED", "CANCELLED"),
                                       timeout=FINALIZE_WAIT)["JobState"]
        except Exception:
            assert self.stack == "mpich", f"Open MPI job did not end: {self.text()}"
            job = self.slurm.job(self.id) or {}
            _where_hung(self.slurm, self.nodes(job) if job.get("NodeList") else [],
                        self.dir / "finalize-hang.txt")
            r = self.slurm.run("h2", [CKPT, "kill", self.id], env=ckpt_env(self.slurm))
            assert r.returncode == 0, r.stderr
            state = self.slurm.wait_job(self.id, ("FAILED", "COMPLETED", "CANCELLED"))
            print(f"job {self.id} ended by ckpt kill: {state['JobState']}")
            return state["JobState"]


# each process of the MPI test programs on a host: its threads' states and
# system calls, and their stacks
WHERE_HUNG = r"""
for pid in $(pgrep -f "$1" | grep -vx $$); do
    echo "--- $pid: $(tr '\0' ' ' < /proc/$pid/cmdline)"
    for t in /proc/$pid/task/*; do
        echo "  ${t##*/} $(cat $t/comm) $(cut -d' ' -f3 $t/stat) wchan=$(cat $t/wchan) syscall=$(cat $t/syscall)"
    done
    timeout 30 gdb -p $pid -batch -nx -ex 'thread apply all bt 12' 2>/dev/null | grep '^#\|^Thread'
done
"""


def _where_hung(slurm, hosts, path):
    """Where each process of the MPI test programs is on hosts, appended to
    path: the record of MPICH's finalize hang (a rank waiting for its PMI
    answer, or spinning in UCX)."""
    with open(path, "a") as record:
        for host in hosts:
            r = slurm.run(host, ["sh", "-c", WHERE_HUNG, "sh", str(MPI_BIN)], timeout=300)
            record.write(f"=== {host}\n{r.stdout}{r.stderr}")
    print(f"hung after PASS (MPICH over UCX, see SRUN_LAYOUTS):\n{path.read_text()}")


@pytest.fixture(scope="module", autouse=True)
def mpi_built():
    subprocess.run(["make", "-s", "-C", str(REPO / "integration" / "mpi")], check=True)


@pytest.fixture
def jobs(slurm, request):
    """Makes BatchJobs; afterwards checks what the hooks promise: no job
    process, node-local directory or staged copy left on any node, no node
    drained or down, every checkpoint still there."""
    made = []
    directory = slurm.cluster.shared_dir / "slurm-ckpt" / \
        request.node.name.replace("[", "-").rstrip("]")
    directory.mkdir(parents=True, exist_ok=True)

    def make(stack, args, **kw):
        job = BatchJob(slurm, directory / f"job{len(made)}", stack, args, **kw)
        made.append(job)
        return job
    yield make
    problems = _leftovers(slurm, timeout=60)
    if problems:
        slurm.run("h1", ["scancel", "--user=root"])
        for host in slurm.cluster.names:
            kill_pids(slurm.job_processes(host))
    assert not problems, f"{problems}\n{slurm.logs()}"
    for job in made:
        used = job.checkpoints_named()
        assert all((Path(path) / "manifest.yaml").exists() for path in used), \
            f"job {job.id}: a checkpoint it wrote or restarted from is gone: {used}"


def _leftovers(slurm, timeout):
    """What the hooks should have left clean, after at most timeout s."""
    deadline = time.monotonic() + timeout
    while True:
        problems = {}
        if slurm.queue():
            problems["queued"] = slurm.queue()
        for host in slurm.cluster.names:
            pids = slurm.job_processes(host)
            if pids:
                problems[f"processes on {host}"] = [_cmdline(p) for p in pids]
            for local in ("/run/ckpt", STAGE):
                r = slurm.run(host, ["sh", "-c", f"ls {local} 2>/dev/null"])
                if r.stdout.split():
                    problems[f"{local} on {host}"] = r.stdout.split()
        states = {h: s for h, s in slurm.node_states().items() if s != "idle"}
        if states:
            problems["nodes"] = states
        if not problems or time.monotonic() > deadline:
            return problems
        time.sleep(0.5)


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace").replace("\0", " ")
    except OSError:
        return str(pid)


_references = {}


def reference(slurm, stack, args, ranks=4, program="ring"):
    """The RESULT line of an uninterrupted run of the same program on one host."""
    key = (stack, tuple(args), ranks, program)
    if key not in _references:
        argv = {"mpich": ["mpirun.mpich", "-np", str(ranks)],
                "openmpi": ["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe",
                            "-np", str(ranks)]}[stack]
        steps, _pace = args   # the ring's result depends on its steps alone
        r = slurm.run("h4", argv + [str(MPI_BIN / stack / program), str(steps), "0"],
                      timeout=300)
        assert r.returncode == 0, r.stderr
        _references[key] = [line for line in r.stdout.splitlines() if line.startswith("RESULT")]
    return _references[key]


@pytest.mark.parametrize("stack", STACKS)
def test_usr1_checkpoints_requeues_and_restarts_on_other_nodes_twice(slurm, jobs, stack,
                                                                     tmp_path):
    args = (600, 20)
    job = jobs(stack, args).submit(exclude=("h3", "h4"))
    assert job.wait_running(0) == ["h1", "h2"]
    job.wait_text("READY")
    # two requeues: h1,h2 -> h3,h4 -> h1,h2
    for restarts, (away, to) in enumerate(((["h1", "h2"], ["h3", "h4"]),
                                           (["h3", "h4"], ["h1", "h2"])), start=1):
        time.sleep(2)
        job.usr1()
        job.wait_pending(restarts)
        job.keep_off(away)
        assert job.wait_running(restarts) == to
        job.wait_text("requeued run", count=restarts)
        job.wait_text(f"ckpt: job {job.id}\n", count=restarts + 1)   # restored
    written = job.checkpoints_named()[::2]   # each checkpoint written, then restarted from
    assert job.checkpoints_named() == [p for path in written for p in (path, path)], job.text()
    _restored_status_json(slurm, job, restarted_from=int(written[-1].rsplit("-", 1)[1]))
    job.finish()
    text = job.text()
    assert text.count("USR1: checkpoint and requeue") == 2 and "failed" not in text, text
    assert job.results() == reference(slurm, stack, args), text
    _usr1_checkpoints_logged(job, written, [{"h1": "h3", "h2": "h4"}, {"h3": "h1", "h4": "h2"}])
    _inspected_and_reported(slurm, job, written, tmp_path)


def _inspected_and_reported(slurm, job, written, tmp_path):
    """`ckpt inspect --json` of each USR1 checkpoint (h1,h2's, then h3,h4's)
    from a node outside the job: its schema, two ranks on each node; and
    `ckpt report` of the job in chromium: every chart drawn, the newest
    checkpoint's nodes, both restarts with their moves."""
    env = ckpt_env(slurm)
    for path, nodes in zip(written, (["h1", "h2"], ["h3", "h4"])):
        found = json.loads(slurm.check("h3", [CKPT, "inspect", path, "--json"], env=env))
        validator("inspect").validate(found)
        assert found["path"] == path and sorted(found["hosts"]) == nodes, found["hosts"]
        ranks = [p for p in found["processes"] if p["exe"].endswith("/ring")]
        assert sorted(p["host"] for p in ranks) == sorted(nodes * 2), \
            [(p["host"], p["exe"]) for p in found["processes"]]
    if BROWSER is None:
        pytest.skip(NO_BROWSER)
    page = job.dir / "report.html"
    made = slurm.check("h3", [CKPT, "report", str(job.img / job.id), "-o", str(page)], env=env)
    assert made == f"{page}\n", made
    tree, console, drawn = browse(page, tmp_path)
    assert console == [], console
    all_drawn(tree, drawn, PLOTS)
    assert sorted(row[0] for row in rows(tree, "table-hosts")) == ["h3", "h4"]
    assert {row[0] for row in rows(tree, "table-processes")} == {"h3", "h4"}
    assert [(row[0], sorted(row[5].split(", ")), row[6])
            for row in rows(tree, "table-restarts")] == [
        (path.rsplit("-", 1)[1].lstrip("0"), moves, "ok")
        for path, moves in zip(written, (["h1→h3", "h2→h4"], ["h3→h1", "h4→h2"]))]


def _restored_status_json(slurm, job, restarted_from):
    """`ckpt status --json` of the batch job restored by its requeued run,
    from a node outside it: its schema, its hosts, what it restarted from."""
    deadline = time.monotonic() + 60
    while True:   # until every host's processes registered again
        document = json.loads(slurm.check("h3", [CKPT, "status", job.id, "--json"],
                                          env=ckpt_env(slurm)))
        validator("status").validate(document)
        [described] = document["jobs"]
        if {p["host"] for p in described["processes"]} == {"h1", "h2"} or \
                time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert described["job_id"] == job.id and described["reachable"], described
    assert described["hosts"] == ["h1", "h2"], described
    assert described["restarted_from"] == restarted_from, described
    assert described["last_checkpoint"]["checkpoint"] == restarted_from, described
    assert {p["host"] for p in described["processes"]} == {"h1", "h2"}
    assert all(p["restored"] for p in described["processes"]), described["processes"]


def _usr1_checkpoints_logged(job, written, moves):
    """The event log has each USR1 checkpoint (both hosts' bytes and
    times, the job killed) and the restart of the requeued run that
    followed it, onto the new nodes; the job's log has each checkpoint's
    progress lines, with each host's bytes, before it says it is done."""
    logged = events_of(job.img / job.id)
    assert [(e["kind"], e["path"]) for e in logged] == \
        [(kind, path) for path in written for kind in ("checkpoint", "restart")], logged
    for event, mapping in zip(logged[1::2], moves):
        assert event["hosts"] == mapping, event
    lines = job.text().splitlines()
    for event, mapping in zip(logged[0::2], moves):
        assert event["kill"] and event["processes"] >= 4, event
        assert sorted(event["hosts"]) == sorted(mapping), event   # where it was taken
        assert event["bytes"] == sum(h["bytes"] for h in event["hosts"].values()) > 0
        assert all(h["write_s"] > 0 and h["processes"] >= 2 for h in event["hosts"].values())
        name = Path(event["path"]).name
        hosts = sorted(event["hosts"])
        progress = [line for line in lines if line.startswith(f"ckpt: job {job.id}: {name} ")]
        assert progress, lines
        # "ckpt-0001 writing images: 3.1 MiB of ~3.0 MiB (h1 1.6 MiB, h2 1.5 MiB)"
        for line in progress:
            assert re.fullmatch(rf"ckpt: job {job.id}: {name} [a-z_ ()-]+: [0-9.]+ [KMGT]?i?B"
                                rf"( of ~[0-9.]+ [KMGT]?i?B)? \({hosts[0]} [0-9.]+ [KMGT]?i?B, "
                                rf"{hosts[1]} [0-9.]+ [KMGT]?i?B\)", line), line
        said = f"ckpt: job {job.id}: checkpoint {event['path']} ("
        done = next(i for i, line in enumerate(lines) if line.startswith(said))
        assert lines.index(progress[0]) < done, lines


def test_time_limit_signal_requeues_and_the_job_finishes(slurm, jobs):
    """The example batch script, its time limit and warning made short:
    --time=1 with --signal=B:USR1@50: Slurm signals the batch shell
    10-40 s into each 1-minute run; the ring needs about 48 s, so at
    least one run ends in a checkpoint and a requeue."""
    args = (2400, 20)
    job = jobs("openmpi", args, sbatch_options=["--time=1", "--signal=B:USR1@50"],
               example=True).submit()
    state = job.finish(timeout=600)
    text = job.text()
    restarts = int(slurm.job(job.id)["Restarts"])
    assert state == "COMPLETED" and restarts >= 1, text
    assert text.count("USR1: checkpoint and requeue") == restarts, text
    assert job.results() == reference(slurm, "openmpi", args), text


def test_requeue_by_slurm_restarts_from_the_latest_periodic_checkpoint(slurm, jobs):
    """scontrol requeue (what a preemption with PreemptMode=REQUEUE does):
    every process of the job gets SIGTERM; the requeued run restarts from
    the latest periodic checkpoint.  Its checkpoints are staged in each
    node's own /dev/shm; the epilog removes the staged copies (the
    jobs fixture checks)."""
    args = (600, 20)
    job = jobs("openmpi", args, ckpt_options=["--interval", "2", "--stage-dir", STAGE]).submit()
    job.wait_text("READY")
    job.wait_checkpoints(2)
    for host in ("h1", "h2"):
        staged = slurm.run(host, ["sh", "-c", f"ls {STAGE}/{job.id}/ckpt-*/*.img; "
                                  f"readlink /run/ckpt/job-{job.id}/stage-{job.id}"]).stdout
        assert ".img" in staged and f"{STAGE}/{job.id}\n" in staged, (host, staged)
    _commands_from_a_node_outside_the_job(slurm, job, "h3")
    slurm.check("h1", ["scontrol", "requeue", job.id])
    job.wait_running(1)
    job.finish()
    text = job.text()
    assert "TERM: the job ends" in text and "requeued run 1: restarting from" in text, text
    assert job.results() == reference(slurm, "openmpi", args), text


def _commands_from_a_node_outside_the_job(slurm, job, host):
    """`ckpt status|checkpoint <slurm job id>` work from any node for the
    job's user; another user is refused in one line and changes nothing."""
    env = ckpt_env(slurm)
    status = slurm.run(host, [CKPT, "status", job.id], env=env)
    assert status.returncode == 0 and job.id in status.stdout, status.stderr
    _status_json(slurm, job, host, env)
    taken = slurm.run(host, [CKPT, "checkpoint", job.id], env=env, timeout=120)
    assert taken.returncode == 0, taken.stderr
    assert taken.stdout.split()[-1].startswith(f"{job.img}/{job.id}/ckpt-"), taken.stdout
    nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    for argv in (["status", job.id], ["checkpoint", job.id], ["kill", job.id]):
        r = slurm.run(host, nobody + [CKPT, *argv], env=env)
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and \
            "Traceback" not in r.stderr, (argv, r.stderr)
    assert slurm.job(job.id)["JobState"] == "RUNNING"


def _status_json(slurm, job, host, env):
    """`ckpt status --json` of a batch job with staged periodic
    checkpoints, from a node outside it: its schema, its hosts, its
    interval, its last checkpoint as the event log has it."""
    document = json.loads(slurm.check(host, [CKPT, "status", job.id, "--json"], env=env))
    validator("status").validate(document)
    [described] = document["jobs"]
    assert described["hosts"] == ["h1", "h2"] and described["interval_s"] == 2, described
    last = described["last_checkpoint"]
    logged = [e for e in events_of(job.img / job.id) if e["kind"] == "checkpoint"]
    assert last["checkpoint"] in [e["checkpoint"] for e in logged] and last["staged"], described
    for event in logged:
        assert sorted(event["hosts"]) == ["h1", "h2"] and event["staged"], event
        assert all("flush_s" in facts for facts in event["hosts"].values()), event


def _a_node_dies(slurm, job, nodes, dies):
    """job runs on nodes (its first the batch host) with periodic
    checkpoints; dies loses everything (slurmd too); the requeued job is
    kept off it, finishes, and the node comes back.  The job's output."""
    job.submit(exclude=[h for h in slurm.cluster.names if h not in nodes])
    job.wait_text("READY")
    job.wait_checkpoints(2)
    assert job.wait_running(0) == list(nodes)
    try:
        slurm.cluster.kill_all(dies)
        job.wait_pending(1)
        job.keep_off([dies])
        assert dies not in job.wait_running(1)
        job.finish()
    finally:
        slurm.revive(dies)
    return job.text()


def test_node_failure_requeues_and_restarts_on_the_nodes_left(slurm, jobs):
    """h2 dies (slurmd and every process there killed): the job fails on
    h1, waits for Slurm to find h2 down (NODE_FAIL), which requeues it; it
    restarts from the latest periodic checkpoint on nodes without h2."""
    args = (800, 20)
    job = jobs("openmpi", args, ckpt_options=["--interval", "3"])
    text = _a_node_dies(slurm, job, nodes=("h1", "h2"), dies="h2")
    assert "lost host h2" in text and "NODE FAILURE" in text, text
    assert job.results() == reference(slurm, "openmpi", args), text


def test_srun_as_the_command_runs_its_tasks_inside_the_job(slurm, jobs):
    """`ckpt slurm run -- srun ./app`: srun's tasks (four self-checking
    counters, two per node) are in the job, are checkpointed on USR1 and
    come back on the requeued job's other nodes; each ends with the hash of
    an uninterrupted run."""
    counter = REPO / "integration" / "apps" / "bin" / "counter"
    args = (600, 10)
    job = jobs("srun", args, command=["srun", "-N", "2", "-n", "4", str(counter),
                                      *map(str, args)]).submit()
    assert job.wait_running(0) == ["h1", "h2"]
    job.wait_text("READY", count=4)
    time.sleep(2)
    job.usr1()
    job.wait_pending(1)
    job.keep_off(["h1", "h2"])
    assert job.wait_running(1) == ["h3", "h4"]
    job.release()
    assert job.slurm.wait_job(job.id, ("COMPLETED",), timeout=120)
    r = slurm.run("h4", [str(counter), *map(str, args)], timeout=120)
    expected = [line for line in r.stdout.splitlines() if line.startswith("RESULT")]
    text = job.text()
    assert len(expected) == 1 and job.results() == expected * 4, text
    assert text.count("PASS") == 4 and "checkpoint /" in text, text


def test_batch_host_failure_requeues_and_restarts_without_it(slurm, jobs):
    """h2, where the batch script and the coordinator run (slurmctld is on
    h1), dies: Slurm requeues the job (NODE_FAIL), and the requeued run, on
    other nodes, restarts from the latest periodic checkpoint (its dead
    predecessor's registry entry is no obstacle)."""
    args = (800, 20)
    job = jobs("openmpi", args, ckpt_options=["--interval", "3"])
    text = _a_node_dies(slurm, job, nodes=("h2", "h3"), dies="h2")
    assert "requeued run 1: restarting from" in text, text
    assert job.results() == reference(slurm, "openmpi", args), text


def _srun_mpi(stack, mpi, steps, pace, layout=("-N", "2", "-n", "4"), program="ring"):
    """`srun --mpi=...` of an MPI test program (two ranks per node unless told)."""
    return ["srun", *layout, f"--mpi={mpi}", str(MPI_BIN / stack / program), str(steps),
            str(pace)]


# (srun options, ranks): one rank per node; four on one node; two per node.
# MPICH's MPI_Finalize over UCX may hang, with no ckpt at all, when ranks
# on several nodes talk TCP (UCX's TCP transport stops progress too early,
# openucx/ucx#8738): two per node hung in 3 of 6 native runs here, one per
# node in none of 12, but once in the suite after a restart.  finish()
# ends such a job with `ckpt kill`; the test then asks that every rank but
# the hung one reached its finalize barrier, answered by its server.
SRUN_LAYOUTS = {
    "one-per-node": (("-N", "2", "-n", "2"), 2),
    "one-node": (("-N", "1", "-n", "4", "--overcommit"), 4),
    "two-per-node": (("-N", "2", "-n", "4"), 4),
}
MOVES = ((["h1", "h2"], ["h3", "h4"]), (["h3", "h4"], ["h1", "h2"]))


def _srun_mpich_restarts(slurm, jobs, layout, program, args, moves):
    """The srun job, requeued len(moves) times (each time off the nodes it
    ran on), then let finish: its state, output and PMI trace."""
    srun_options, ranks = SRUN_LAYOUTS[layout]
    trace = slurm.cluster.shared_dir / f"pmi-{layout}-{program}.trace"
    job = jobs("mpich", args, command=["env", f"CKPT_PMI_TRACE={trace}"] +
               _srun_mpi("mpich", "pmi2", *args, layout=srun_options, program=program)).submit()
    assert job.wait_running(0) == ["h1", "h2"]
    job.wait_text("READY")
    job.requeue_along(moves)
    state = job.finish()
    text, lines = job.text(), trace.read_text()
    assert "connected outside the job" not in text and "reconnected" not in text, text
    assert job.results() == reference(slurm, "mpich", args, ranks, program), text
    # the finalize barrier goes to the ranks' servers after the restarts.
    # Every rank gets there when the job completes; under UCX's finalize
    # hang (openucx/ucx#8738, ended by `ckpt kill`) the ranks of one node
    # may spin in UCX and never reach it, but the others do.
    if state == "COMPLETED":
        assert lines.count(" app>> cmd=barrier_in") >= ranks, lines
        assert lines.count(" <<local cmd=finalize_ack") == ranks, lines
    else:
        assert lines.count(" app>> cmd=barrier_in") >= 1, lines
        # the record: which ranks reached their finalize barrier (time, rank)
        ends = [line for line in lines.splitlines() if "barrier" in line or "finalize" in line]
        print("the last PMI barriers and finalizes:\n" + "\n".join(ends[-4 * ranks:]))
    return state, text, lines


@pytest.mark.parametrize("layout", SRUN_LAYOUTS)
def test_srun_mpich_pmi2_restarts_on_other_nodes_twice(slurm, jobs, layout):
    """`ckpt slurm run -- srun --mpi=pmi2 ring` (MPICH): the ranks' PMI goes
    through their task server (native/remote/pmi_proxy.c), so after each
    requeue the ring goes on, on other nodes, and its MPI_Finalize barrier
    is answered by ckpt's name service (the trace of the PMI lines shows
    it): the job ends with the result of an uninterrupted run, nothing is
    said of connections outside the job, and no process is left (the jobs
    fixture)."""
    _srun_mpich_restarts(slurm, jobs, layout, "ring", (600, 20), MOVES)


@pytest.mark.parametrize("program", ["allreduce", "jacobi", "bigmsg"])
def test_srun_mpich_pmi2_programs_restart_on_other_nodes(slurm, jobs, program):
    """The other MPI test programs under srun --mpi=pmi2, one rank per node,
    requeued once onto other nodes: the uninterrupted result."""
    _srun_mpich_restarts(slurm, jobs, "one-per-node", program, (300, 20), MOVES[:1])


def test_srun_pmi_barriers_and_gets_go_on_across_two_requeues(slurm, jobs):
    """A PMI-1 client of its own (apps/pmi_steps: put, barrier, get of every
    task's value, checked, at each step) under srun --mpi=pmi2, requeued
    twice onto other nodes: barrier after barrier and get after get are
    relayed to slurmstepd before the first requeue and answered by ckpt's
    name service after each one; every value checks and the job COMPLETES
    with the result of an uninterrupted run."""
    prog = str(REPO / "integration" / "apps" / "bin" / "pmi_steps")
    srun = ["srun", "-N", "2", "-n", "2", "--mpi=pmi2", prog]
    r = slurm.run("h4", srun + ["1500", "0"], timeout=120)
    expected = [line for line in r.stdout.splitlines() if line.startswith("RESULT")]
    assert r.returncode == 0 and len(expected) == 1, r.stdout + r.stderr
    trace = slurm.cluster.shared_dir / "pmi-steps.trace"
    job = jobs("pmi", (1500, 20), command=["env", f"CKPT_PMI_TRACE={trace}"] + srun +
               ["1500", "20"]).submit()
    assert job.wait_running(0) == ["h1", "h2"]
    job.wait_text("READY")
    job.requeue_along(MOVES)
    job.release()
    state = slurm.wait_job(job.id, ("COMPLETED", "FAILED", "CANCELLED"), timeout=180)
    text, lines = job.text(), trace.read_text()
    assert state["JobState"] == "COMPLETED", text
    assert job.results() == expected and "FAIL" not in text, text
    # several barriers answered after the restarts, by every task
    assert lines.count(" <<local cmd=barrier_out") >= 2 * 2, lines[-2000:]


def _srun_openmpi_restarts(slurm, jobs, layout, program, args, moves):
    """Open MPI under `srun --mpi=pmix`, requeued len(moves) times (each time
    off the nodes it ran on), then let finish: it must COMPLETE with the
    result of an uninterrupted run, its ranks' PMIx answered by
    plugins/pmix after each restart (libpmix's server is gone), and nothing
    said of connections outside the job."""
    srun_options, ranks = SRUN_LAYOUTS[layout]
    trace = slurm.cluster.shared_dir / f"pmix-{layout}-{program}.trace"
    job = jobs("openmpi", args, command=["env", f"CKPT_PMIX_TRACE={trace}"] +
               _srun_mpi("openmpi", "pmix", *args, layout=srun_options,
                         program=program)).submit()
    assert job.wait_running(0) == ["h1", "h2"]
    job.wait_text("READY")
    job.requeue_along(moves)
    state = job.finish()
    text = job.text()
    assert state == "COMPLETED", text
    assert "connected outside the job" not in text and "reconnected" not in text, text
    assert job.results() == reference(slurm, "openmpi", args, ranks, program), text
    # every rank's fences: through slurmstepd at MPI_Init, through ckpt's
    # name service after the restarts (MPI_Finalize's), all successful
    calls = [line.split()[1:] for line in trace.read_text().splitlines()]
    for by in ("server", "local"):
        fenced = {rank for rank, call, b, _us, status in calls if call == "fence" and b == by}
        assert fenced == {str(r) for r in range(ranks)}, (by, calls)
    assert all(status == "0" for *_x, status in calls if _x[1] == "fence"), calls


@pytest.mark.parametrize("layout", SRUN_LAYOUTS)
def test_srun_openmpi_pmix_restarts_on_other_nodes_twice(slurm, jobs, layout):
    """`ckpt slurm run -- srun --mpi=pmix ring` (Open MPI): after each
    requeue, on other nodes, the ring goes on; its fences, gets and
    finalize are answered by the PMIx plugin and the name service."""
    _srun_openmpi_restarts(slurm, jobs, layout, "ring", (600, 20), MOVES)


@pytest.mark.parametrize("program", ["allreduce", "jacobi", "bigmsg"])
def test_srun_openmpi_pmix_programs_restart_on_other_nodes(slurm, jobs, program):
    """The other MPI test programs under srun --mpi=pmix, two ranks per
    node, requeued once onto other nodes: the uninterrupted result."""
    _srun_openmpi_restarts(slurm, jobs, "two-per-node", program, (300, 20), MOVES[:1])


def _checkpoint_now(slurm, job, host="h3"):
    """`ckpt checkpoint <job>` from a node outside it, as its user would."""
    return slurm.run(host, [CKPT, "checkpoint", job.id], env=ckpt_env(slurm), timeout=180)


def _one_line(r):
    """A refusal: a failed command with one line on stderr, no traceback."""
    lines = r.stderr.strip().splitlines()
    return r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr


# program: (what the dynamic call is named in the program's output, words of
# the refusal that name it)
DYNAMIC = {"spawn": ("SPAWN", "MPI_Comm_spawn"), "connect": ("CONNECT", "MPI_Comm_connect")}
SRUN_MPI = {"openmpi": "pmix", "mpich": "pmi2"}


@pytest.mark.parametrize("program", DYNAMIC)
@pytest.mark.parametrize("stack", STACKS)
def test_srun_dynamic_process_call_refuses_later_checkpoints(slurm, jobs, stack, program):
    """`ckpt slurm run -- srun --mpi=pmix|pmi2 PROG` where PROG (integration/mpi
    spawn.c, connect.c) calls MPI_Comm_spawn, or MPI_Publish_name /
    MPI_Lookup_name and MPI_Comm_accept/connect, half-way (after a gate the
    test opens).  First what srun alone does with the call (no ckpt): its
    outcome line, and whether the program then hangs (Open MPI's spawn
    under Slurm's PMIx fails, then the job hangs).  Under ckpt the program
    says the same, and a checkpoint before the call is taken.
    Where the call reached Slurm's PMI, the user's `ckpt checkpoint` after
    it is refused in one line naming the call, the job keeps running and
    its checkpoints stay as they were; a job that hangs as under srun alone
    is then ended by the user (`ckpt kill`), its checkpoints whole; else
    USR1 is refused too, and the job, requeued, restarts on other nodes
    from the checkpoint before the call.  Where the call never reached Slurm's PMI (MPICH over UCX opens
    no port and spawns nothing), the checkpoint is taken and the job,
    requeued, restarts on other nodes from it.  Either way the job ends
    with the result of an uninterrupted run (MPICH: see SRUN_LAYOUTS on
    its finalize)."""
    what, named = DYNAMIC[program]
    args = (200, 20)
    layout, ranks = SRUN_LAYOUTS["one-per-node"]    # MPICH's finalize over UCX: see above
    srun = _srun_mpi(stack, SRUN_MPI[stack], *args, layout=layout, program=program)
    native = slurm.run("h4", ["timeout", "60"] + _srun_mpi(
        stack, SRUN_MPI[stack], args[0], 0, program=program, layout=("-N", "1", "-n", "2")),
        timeout=120)
    hangs = native.returncode == 124    # srun stopped by timeout: its step ends
    if hangs:   # where: the last of the program's lines srun alone printed
        last = "DYNAMIC" if "DYNAMIC" in native.stdout else "CALLING"
        assert last in native.stdout and "RESULT" not in native.stdout, native.stdout
    else:
        expected = [line for line in native.stdout.splitlines() if line.startswith("RESULT")]
        assert native.returncode == 0 and len(expected) == 1, native.stdout + native.stderr
    gate = slurm.cluster.shared_dir / f"gate-{stack}-{program}"
    gate.touch()
    job = jobs(stack, args, command=["env", f"ZDTM_GATE={gate}"] + srun).submit()
    assert job.wait_running(0) == ["h1", "h2"]
    job.wait_text("READY")
    before = _checkpoint_now(slurm, job)
    assert before.returncode == 0, before.stderr
    taken = [Path(before.stdout.split()[-1]).name]
    gate.unlink()
    job.wait_text(last if hangs else "DYNAMIC")
    for _attempt in range(3):
        # a hanging call: rank 0 may not be inside it yet (then this one is
        # a checkpoint before the call: taken, and asked again)
        after = _checkpoint_now(slurm, job)
        if after.returncode != 0 or not hangs:
            break
        taken.append(Path(after.stdout.split()[-1]).name)
    text = job.text()
    # what the call did under ckpt is what it does under srun alone
    assert _outcome(text, what) == _outcome(native.stdout, what), (text, native.stdout)
    if after.returncode != 0:
        assert _one_line(after) and named in after.stderr, after.stderr
        assert slurm.job(job.id)["JobState"] == "RUNNING", job.text()
        assert job.checkpoints() == taken, (job.checkpoints(), taken)
    if hangs:   # as under srun alone: the user ends it; its checkpoints stay
        assert after.returncode != 0, after.stdout
        killed = slurm.run("h3", [CKPT, "kill", job.id], env=ckpt_env(slurm))
        assert killed.returncode == 0, killed.stderr
        slurm.wait_job(job.id, ("FAILED", "CANCELLED", "COMPLETED"))
        _checkpoints_whole(slurm, job, taken)
        return
    if after.returncode != 0:
        job.requeue_along(MOVES[:1])
        text = job.text()
        assert "the checkpoint failed" in text and named in text, text
        assert f"restarting from {job.img / job.id / taken[-1]}" in text, text
    else:   # the call never reached Slurm's PMI: the job must restart
        job.requeue_along(MOVES[:1])
    _checkpoints_whole(slurm, job, taken)
    state = job.finish()
    text = job.text()
    assert state == "COMPLETED" or stack == "mpich", text
    assert job.results() == expected, text


def _checkpoints_whole(slurm, job, names):
    """Every one of the job's checkpoints named is there and whole."""
    for name in names:
        assert (job.img / job.id / name / "manifest.yaml").exists(), name
    images = slurm.run("h3", [CKPT, "images", str(job.img / job.id)], env=ckpt_env(slurm))
    assert images.returncode == 0, images.stdout + images.stderr


def _outcome(text, what):
    """'SPAWN ok' or 'SPAWN failed' (MPI's error strings hold addresses)."""
    return [line.split(":")[0] for line in text.splitlines() if line.startswith(what + " ")]


def _ranks_on(slurm, host, program):
    """The pids of program's ranks on host."""
    r = slurm.run(host, ["pgrep", "-f", str(program)])
    return r.stdout.split()


@pytest.mark.parametrize("stack", STACKS)
def test_salloc_srun_job_restarts_with_hosts_on_other_nodes_of_the_allocation(
        slurm, jobs, stack):
    """Inside `salloc -N 4`, as a user would: `ckpt launch -- srun -w h1,h2
    --mpi=pmix|pmi2 ring`, `ckpt checkpoint --kill` from another node, then
    `ckpt restart --hosts h3,h4` in the same allocation: the ranks run
    again on h3 and h4 (none left on h1, h2), their ckpt-restart started
    by srun as a step of the allocation, not by ssh (the ranks' ancestors
    there hold slurmstepd and no sshd), their PMI answered by ckpt after
    the restart; the allocation's job ends COMPLETED with the result of an
    uninterrupted run."""
    args = (600, 20)
    layout, ranks = SRUN_LAYOUTS["two-per-node" if stack == "openmpi" else "one-per-node"]
    d = slurm.cluster.shared_dir / "slurm-ckpt" / f"salloc-{stack}"
    d.mkdir(parents=True, exist_ok=True)
    img, hold, out, script = d / "img", d / "hold", d / "out", d / "alloc.sh"
    hold.touch()
    job_id = f"salloc-{stack}"
    program = MPI_BIN / stack / "ring"
    srun = _srun_mpi(stack, SRUN_MPI[stack], *args, layout=layout + ("-w", "h1,h2"))
    script.write_text(
        "#!/bin/sh\n"
        f"export CKPT_SHARED_STATE_DIR={registry(slurm)} ZDTM_HOLD={hold}\n"
        f"{CKPT} launch --job-id {job_id} --ckpt-dir {img} -- {' '.join(srun)}\n"
        "echo \"LAUNCH ENDED $?\"\n"
        f"exec {CKPT} restart {img / job_id} --hosts h3,h4\n")
    with open(out, "w") as sink:
        salloc = slurm.cluster.popen("h1", ["salloc", "-N", "4", "--ntasks-per-node=2", "sh",
                                            str(script)],
                                     stdout=sink, stderr=subprocess.STDOUT,
                                     env=ckpt_env(slurm))
    try:
        text = lambda: out.read_text(errors="replace")   # noqa: E731
        _wait_for(lambda: "READY" in text(), text)
        allocation = text().split("Granted job allocation ")[1].split()[0]
        time.sleep(2)
        taken = slurm.run("h3", [CKPT, "checkpoint", job_id, "--kill"], env=ckpt_env(slurm),
                          timeout=180)
        assert taken.returncode == 0, taken.stderr
        _wait_for(lambda: "LAUNCH ENDED" in text(), text)
        _wait_for(lambda: all(_ranks_on(slurm, h, program) for h in ("h3", "h4")), text)
        assert not any(_ranks_on(slurm, h, program) for h in ("h1", "h2")), text()
        for host in ("h3", "h4"):
            for rank in _ranks_on(slurm, host, program):
                chain = _ancestors(slurm, host, rank)
                assert "slurmstepd" in chain and "sshd" not in chain, (host, chain, text())
        hold.unlink()
        _wait_for(lambda: "PASS" in text(), text)
        try:
            salloc.wait(timeout=FINALIZE_WAIT)
        except subprocess.TimeoutExpired:   # MPICH's finalize over UCX: see SRUN_LAYOUTS
            assert stack == "mpich", f"Open MPI job did not end: {text()}"
            _where_hung(slurm, ["h3", "h4"], d / "finalize-hang.txt")
            killed = slurm.run("h3", [CKPT, "kill", job_id], env=ckpt_env(slurm))
            assert killed.returncode == 0, killed.stderr
            salloc.wait(timeout=60)
    finally:
        hold.unlink(missing_ok=True)
        if salloc.poll() is None:
            salloc.kill()
            slurm.run("h1", ["scancel", "--user=root"])
    state = slurm.wait_job(allocation, ("COMPLETED", "FAILED", "CANCELLED"))["JobState"]
    assert (salloc.returncode == 0 and state == "COMPLETED") or stack == "mpich", text()
    results = [line for line in text().splitlines() if line.startswith("RESULT")]
    assert results == reference(slurm, stack, args, ranks), text()
    assert "connected outside the job" not in text() and "reconnected" not in text(), text()


# the names (comm) of a process's ancestors, its parent first, up to its
# host's first process; run on the host (each host has its pid namespace)
ANCESTORS = """
import sys
pid, names = int(sys.argv[1]), []
try:
    while pid > 1:
        stat = open(f"/proc/{pid}/stat").read()
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
        names.append(open(f"/proc/{pid}/comm").read().strip())
except OSError:
    pass
print(" ".join(names))
"""


def _ancestors(slurm, host, pid):
    """The names of the ancestors of pid (a pid of host's namespace) on host."""
    r = slurm.run(host, ["python3", "-c", ANCESTORS, str(pid)])
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def _wait_for(condition, text, timeout=180):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, text()
        time.sleep(0.2)
