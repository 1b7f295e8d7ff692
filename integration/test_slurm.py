"""Slurm on the test cluster (slurm_cluster.py): batch jobs whose steps run
on two hosts; two jobs sharing nodes and `srun --overlap` in a running job;
MPICH and Open MPI jobs that mpirun starts through Slurm inside an
allocation (no ssh) across two hosts, with the result of a run on one host;
a running batch job requeued by `scontrol requeue` runs again with
SLURM_RESTART_COUNT=1, and so does one whose node dies (on another node);
Prolog, Epilog and TaskProlog run.  After every test
no job process is left on any host and no node is drained or down."""
import os
import time

import pytest

from harness import REPO
from slurm_cluster import SlurmError

pytestmark = [pytest.mark.multihost, pytest.mark.slurm]
MPI_BIN = REPO / "integration" / "mpi" / "bin"
RING_ARGS = (100, 5)
FINALIZE_WAIT = 15  # after PASS, every rank is in MPI_Finalize


@pytest.fixture(scope="module", autouse=True)
def mpi_built():
    import subprocess
    subprocess.run(["make", "-s", "-C", str(REPO / "integration" / "mpi")], check=True)


@pytest.fixture
def workdir(slurm, request):
    """A directory of this test on the shared filesystem (job output)."""
    d = slurm.cluster.shared_dir / "slurm" / request.node.name.replace("[", "-").rstrip("]")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(autouse=True)
def nothing_left(slurm):
    """After the test: no job queued, no job process on any host, every
    node idle (a node a job's end drained would stay drained)."""
    yield
    deadline = time.monotonic() + 60
    while True:
        queued = slurm.queue()
        left = {h: slurm.job_processes(h) for h in slurm.cluster.names}
        left = {h: pids for h, pids in left.items() if pids}
        states = slurm.node_states()
        busy = {h: s for h, s in states.items() if s != "idle"}
        if not queued and not left and not busy:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    described = {h: [_cmdline(p) for p in pids] for h, pids in left.items()}
    slurm.run("h1", ["scancel", "--user=root"])
    for host in left:
        slurm.cluster.kill_all(host)
    pytest.fail(f"left behind: jobs {queued}, processes {described}, nodes {busy}\n"
                + slurm.logs())


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return str(pid)


def _text(path):
    return path.read_text(errors="replace") if path.exists() else ""


def _script(path, body):
    path.write_text("#!/bin/sh\n" + body)
    os.chmod(path, 0o755)
    return path


def test_batch_job_steps_run_on_two_hosts(slurm, workdir):
    out = workdir / "hostname.out"
    job = slurm.sbatch("h3", ["-N", "2", "-o", str(out), "--wrap", "srun hostname"])
    done = slurm.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"))
    assert done["JobState"] == "COMPLETED", out.read_text()
    hosts = out.read_text().split()
    assert len(hosts) == 2 and len(set(hosts)) == 2, hosts
    assert set(hosts) <= set(slurm.cluster.names)
    # munge and Slurm talk over TCP between hosts, never through a shared socket
    assert slurm.cluster.cross_host_unix_connections() == []


def test_two_jobs_share_nodes_and_an_overlap_step_joins_a_running_job(slurm, workdir):
    jobs = [slurm.sbatch("h1", ["-N", "2", "-w", "h1,h2", "--ntasks-per-node=2",
                                "-o", str(workdir / f"{i}.out"), "--wrap", "srun sleep 600"])
            for i in range(2)]
    for job in jobs:      # both at once on the same nodes, each using every core
        slurm.wait_job(job, ("RUNNING",), timeout=60)
    r = slurm.run("h3", ["srun", f"--jobid={jobs[0]}", "--overlap", "-N", "2", "hostname"])
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == ["h1", "h2"]
    slurm.check("h1", ["scancel", *jobs])
    for job in jobs:
        slurm.wait_job(job, ("CANCELLED",))


def _reference(slurm, stack, workdir):
    """The ring's RESULT line from a run of 4 ranks on one host, no Slurm."""
    argv = {"mpich": ["mpirun.mpich", "-np", "4"],
            "openmpi": ["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe",
                        "-np", "4"]}[stack]
    r = slurm.run("h4", argv + [str(MPI_BIN / stack / "ring"), *map(str, RING_ARGS)],
                  timeout=120, cwd=str(workdir))
    assert r.returncode == 0, r.stderr
    return [line for line in r.stdout.splitlines() if line.startswith("RESULT")]


@pytest.mark.parametrize("stack", ["mpich", "openmpi"])
def test_mpirun_in_an_allocation_launches_through_slurm(slurm, workdir, stack):
    subnet = slurm.cluster.subnet
    mpirun = {"mpich": "mpirun.mpich -np 4",
              "openmpi": "mpirun.openmpi --allow-run-as-root --oversubscribe -np 4 "
                         f"--mca btl_tcp_if_include {subnet} "
                         f"--mca oob_tcp_if_include {subnet}"}[stack]
    ring = f"{MPI_BIN / stack / 'ring'} {' '.join(map(str, RING_ARGS))}"
    script = _script(workdir / "job.sh",
                     f"{mpirun} hostname > {workdir}/ranks.out\n"
                     f"{mpirun} {ring}\n")
    out = workdir / "job.out"
    job = slurm.sbatch("h1", ["-N", "2", "--ntasks-per-node=2", "-o", str(out), str(script)])
    ended = ("COMPLETED", "FAILED", "CANCELLED")
    slurm.wait_job(job, ("RUNNING",) + ended, timeout=180,
                   until=lambda j: j["JobState"] != "RUNNING" or "PASS" in _text(out))
    try:
        done = slurm.wait_job(job, ended, timeout=FINALIZE_WAIT)
    except SlurmError:
        # MPICH over UCX 1.13 may hang in MPI_Finalize after its work
        # (openucx/ucx#8738, as in test_multihost): Slurm ends it then
        assert stack == "mpich", "Open MPI job did not exit\n" + _text(out)
        slurm.check("h1", ["scancel", job])
        done = slurm.wait_job(job, ("CANCELLED",))
    text = out.read_text(errors="replace")
    assert done["JobState"] in ("COMPLETED", "CANCELLED"), text
    assert done["JobState"] == "COMPLETED" or stack == "mpich", text
    ranks = (workdir / "ranks.out").read_text().split()
    assert len(ranks) == 4 and len(set(ranks)) == 2, ranks
    # the remote ranks' launcher (hydra's proxy, orted) came through slurmd:
    # a step of this job on the other node, not an ssh session
    other = (set(ranks) - {done["BatchHost"]}).pop()
    slurmd_log = (slurm.log_dir / f"slurmd-{other}.log").read_text()
    assert f"launch task StepId={job}.0 " in slurmd_log
    results = [line for line in text.splitlines() if line.startswith("RESULT")]
    assert "PASS" in text and results == _reference(slurm, stack, workdir)


def test_requeued_running_job_runs_again_with_restart_count(slurm, workdir):
    runs = workdir / "runs"
    script = _script(workdir / "job.sh",
                     f'echo "run ${{SLURM_RESTART_COUNT:-0}} $(hostname)" >> {runs}\n'
                     'if [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ]; then\n'
                     f'    echo done >> {runs}; exit 0\n'
                     'fi\n'
                     'exec sleep 600\n')
    job = slurm.sbatch("h2", ["--requeue", "-N", "1", "-o", str(workdir / "job.out"),
                              str(script)])
    slurm.wait_job(job, ("RUNNING",), until=lambda j: runs.exists())
    slurm.check("h2", ["scontrol", "requeue", job])
    done = slurm.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=180)
    assert done["JobState"] == "COMPLETED"
    assert done["Restarts"] == "1"
    lines = runs.read_text().splitlines()
    assert [line.split()[:2] for line in lines[:2]] == [["run", "0"], ["run", "1"]], lines
    assert lines[2:] == ["done"], lines


def test_a_node_that_dies_requeues_its_job_elsewhere_and_comes_back(slurm, workdir):
    runs = workdir / "runs"
    script = _script(workdir / "job.sh",
                     f'echo "run ${{SLURM_RESTART_COUNT:-0}} $(hostname)" >> {runs}\n'
                     '[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] && exit 0\n'
                     'exec sleep 600\n')
    # not on h1: its slurmctld must live on
    job = slurm.sbatch("h1", ["--requeue", "-N", "1", "-x", "h1", "-o",
                              str(workdir / "job.out"), str(script)])
    first = slurm.wait_job(job, ("RUNNING",), until=lambda j: runs.exists())["BatchHost"]
    slurm.cluster.kill_all(first)         # the node dies: daemons and job
    done = slurm.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=180)
    assert done["JobState"] == "COMPLETED" and done["Restarts"] == "1"
    lines = [line.split() for line in runs.read_text().splitlines()]
    assert lines[0] == ["run", "0", first] and lines[1][:2] == ["run", "1"], lines
    assert lines[1][2] not in (first, "h1") and len(lines) == 2, lines
    assert slurm.node_states()[first].startswith("down")
    slurm.revive(first)                   # and comes back (ReturnToService=2)
    assert slurm.node_states()[first] == "idle"


def test_prolog_epilog_task_prolog_and_a_clean_stop(slurm):
    """A second Slurm, on its own 2-host cluster, with Prolog, Epilog and
    TaskProlog scripts: they run on every node of a job (the TaskProlog's
    `export` reaches the task); stop() leaves no Slurm process on any host
    and no /etc/slurm mount, and may be called again."""
    from cluster import Cluster
    from slurm_cluster import SlurmCluster
    root_etc = sorted(os.listdir("/etc/slurm")) if os.path.isdir("/etc/slurm") else None
    with Cluster(n=2) as c:
        marks = c.shared_dir / "marks"
        hooks = c.shared_dir / "hooks"
        hooks.mkdir()
        for name in ("prolog", "epilog"):
            _script(hooks / name, f'echo "{name} $(hostname) $SLURM_JOB_ID" >> {marks}\n')
        _script(hooks / "task_prolog", 'echo "export FROM_TASK_PROLOG=$(hostname)"\n')
        s = SlurmCluster(c, prolog=hooks / "prolog", epilog=hooks / "epilog",
                         task_prolog=hooks / "task_prolog")
        try:
            s.start()
            out = c.shared_dir / "job.out"
            job = s.sbatch("h1", ["-N", "2", "-o", str(out), "--wrap",
                                  'srun sh -c \'echo "$(hostname) $FROM_TASK_PROLOG"\''])
            assert s.wait_job(job, ("COMPLETED", "FAILED"))["JobState"] == "COMPLETED", \
                _text(out)
            assert sorted(out.read_text().splitlines()) == ["h1 h1", "h2 h2"]
            # the epilog runs as the job ends: bounded wait for both nodes'
            deadline = time.monotonic() + 30
            want = sorted(f"{k} {h} {job}" for k in ("prolog", "epilog") for h in ("h1", "h2"))
            while sorted(_text(marks).splitlines()) != want and time.monotonic() < deadline:
                time.sleep(0.2)
            assert sorted(_text(marks).splitlines()) == want
        finally:
            s.stop()
        s.stop()
        for host in c.names:
            assert s.job_processes(host) == [] and s._slurm_pids(host) == []
            mounts = c.run(host, ["grep", " /etc/slurm ", "/proc/self/mounts"],
                           capture_output=True, text=True)
            assert mounts.stdout == ""
    # the root namespace's /etc/slurm was never written
    assert root_etc == (sorted(os.listdir("/etc/slurm")) if os.path.isdir("/etc/slurm") else None)
