"""Benchmark of a Slurm batch job under `ckpt slurm run` (issue 12), on the
test cluster with real slurmctld/slurmd (integration/slurm_cluster.py; root).

A 2-node job, 4 ranks x 512 MiB (bench/mpi/mpimem: rank 0 prints a tick
every 50 ms), of MPICH launched by mpirun and by srun --mpi=pmi2, and of
Open MPI launched by mpirun and by srun --mpi=pmix (issue 36).
Each round: USR1 to the batch shell; the times to the checkpoint written
and to the allocation given back (the job pending again); the requeued job
is kept off its first nodes, and the time from its start (RUNNING) to the
application running again (its first tick after the restart).  Baselines
in the same run: one sequential write()+fsync and a read() of the same
bytes on the same filesystem (no job running), the first run's start to
READY (a launch from scratch that fills its memory), and the mpirun job's
times for the srun job's of the same MPI.  Then the PMI layer's cost per fence: a short
srun ring requeued once, each rank's barrier from its request to its
answer, relayed to slurmstepd before the restart and answered through
ckpt's name service after it (CKPT_PMI_TRACE); and the same of PMIx's
fences and gets in a short srun --mpi=pmix ring of Open MPI, through
libpmix and slurmstepd before the restart, answered by the PMIx plugin
and the name service after it (CKPT_PMIX_TRACE).

    python3 bench/slurm_bench.py [--reps 2] [--mib 512] [--smoke]

--smoke: 16 MiB per rank, one requeue: that the benchmark still runs.
"""
import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "integration"))

from engine_bench import baseline, fmt, table  # noqa: E402

MPIMEM = REPO / "bench" / "mpi" / "bin" / "mpimem"
CKPT = str(REPO / "bin" / "ckpt")
HOOKS = REPO / "plugins" / "slurm"
POLL = 0.01


MPIMEM_OPENMPI = REPO / "bench" / "mpi" / "bin" / "openmpi" / "mpimem"
# name -> (program, launcher); each srun form is compared with the mpirun
# form of the same MPI
LAUNCHERS = {
    "mpirun (MPICH)": (MPIMEM, ["mpirun.mpich", "-np", "4"]),
    "srun pmi2 (MPICH)": (MPIMEM, ["srun", "-N", "2", "-n", "4", "--mpi=pmi2"]),
    "mpirun (Open MPI)": (MPIMEM_OPENMPI, ["mpirun.openmpi", "--allow-run-as-root",
                                          "--oversubscribe", "-np", "4"]),
    "srun pmix (Open MPI)": (MPIMEM_OPENMPI, ["srun", "-N", "2", "-n", "4", "--mpi=pmix"]),
}
PAIRS = (("srun pmi2 (MPICH)", "mpirun (MPICH)"), ("srun pmix (Open MPI)", "mpirun (Open MPI)"))


class BatchJob:
    def __init__(self, slurm, command, name):
        self.slurm = slurm
        self.dir = slurm.cluster.shared_dir / f"slurm-bench-{name}"
        self.dir.mkdir(exist_ok=True)
        self.out = self.dir / "job.out"
        self.trace = self.dir / "pmi.trace"
        self.pmix_trace = self.dir / "pmix.trace"
        script = self.dir / "job.sh"
        script.write_text(
            "#!/bin/sh\n"
            f"export CKPT_SHARED_STATE_DIR={self.dir / 'registry'}\n"
            f"export CKPT_PMI_TRACE={self.trace}\n"
            f"export CKPT_PMIX_TRACE={self.pmix_trace}\n"
            f"exec {CKPT} slurm run --ckpt-dir {self.dir / 'img'} -- {' '.join(command)}\n")
        script.chmod(0o755)
        self.script = script
        self.id = None

    def text(self):
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def state(self):
        return (self.slurm.job(self.id) or {}).get("JobState")

    def until(self, what, test, timeout=600):
        deadline = time.monotonic() + timeout
        while not test():
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurm bench: no {what} within {timeout} s:\n{self.text()}")
            time.sleep(POLL)
        return time.monotonic()

    def submit(self):
        self.id = self.slurm.sbatch("h1", ["-N", "2", "--ntasks-per-node=2", "--requeue",
                                           "--open-mode=append", "--exclude=h3,h4",
                                           "-o", str(self.out), str(self.script)])
        running = self.until("start", lambda: self.state() == "RUNNING")
        return self.until("READY", lambda: "READY" in self.text()) - running

    def usr1_round(self, restarts, away):
        """(USR1 -> checkpoint written, USR1 -> allocation given back,
        requeued start -> application running)."""
        marker = f"ckpt: job {self.id}: checkpoint /"
        before = self.text().count(marker)
        sent = time.monotonic()
        self.slurm.check("h1", ["scancel", "--signal=USR1", "--batch", self.id])
        written = self.until("checkpoint", lambda: self.text().count(marker) > before)
        given_back = self.until("pending", lambda: self.state() == "PENDING")
        self.slurm.check("h1", ["scontrol", "update", f"JobId={self.id}",
                                f"ExcNodeList={','.join(away)}"])
        restarted = f"requeued run {restarts}:"
        started = self.until("requeued start", lambda: self.state() == "RUNNING")
        running = self.until("tick after the restart", lambda: "tick" in
                             self.text().split(restarted, 1)[-1] and restarted in self.text())
        return written - sent, given_back - sent, running - started

    def cancel(self):
        self.slurm.run("h1", ["scancel", self.id])
        self.until("end", lambda: self.state() not in ("RUNNING", "COMPLETING", "PENDING"),
                   timeout=120)

    def fences(self):
        """Each rank's PMI barriers, request to answer, in ms: (relayed to
        slurmstepd, answered after a restart)."""
        relayed, local, asked = [], [], {}
        for line in self.trace.read_text().splitlines():
            t, rank, direction, text = line.split(" ", 3)
            if text.startswith("cmd=barrier_in"):
                asked[rank] = int(t)
            elif text.startswith("cmd=barrier_out") and rank in asked:
                (local if direction == "<<local" else relayed).append(
                    (int(t) - asked.pop(rank)) / 1000)
        return relayed, local

    def pmix_calls(self):
        """{(call, by): [ms]}: each rank's PMIx fences and gets, call to
        answer, by "server" (before the restart) or "local" (after)."""
        calls = {}
        for line in self.pmix_trace.read_text().splitlines():
            _t, _rank, call, by, us, _status = line.split()
            calls.setdefault((call, by), []).append(int(us) / 1000)
        return calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--smoke", action="store_true",
                        help="smallest size, once: does it still run (make bench-smoke)")
    args = parser.parse_args()
    if args.smoke:
        args.reps, args.mib = 1, 16
    from cluster import Cluster, ClusterUnavailable
    from slurm_cluster import SlurmCluster, why_unavailable
    reason = why_unavailable()
    if reason:
        print(f"\nSlurm job: skipped ({reason})")
        return
    try:
        cluster = Cluster(n=4).start()
    except ClusterUnavailable as exc:
        print(f"\nSlurm job: skipped ({exc})")
        return
    try:
        subprocess.run(["make", "-s", "-C", str(REPO / "bench" / "apps")], check=True)
        subprocess.run(["make", "-s", "-C", str(REPO / "bench" / "mpi")], check=True)
        subprocess.run(["make", "-s", "-C", str(REPO / "integration" / "mpi")], check=True)
        with SlurmCluster(cluster, prolog=HOOKS / "prolog", epilog=HOOKS / "epilog",
                          task_prolog=HOOKS / "task_prolog") as slurm:
            run(slurm, args.mib, args.reps)
    finally:
        cluster.stop()


def launcher_rounds(slurm, mib, reps, launcher):
    """(launch s, [(written, given back, running again)] per requeue)."""
    program, argv = LAUNCHERS[launcher]
    job = BatchJob(slurm, argv + [str(program), str(mib)],
                   launcher.replace(" ", "-").replace("(", "").replace(")", ""))
    launch = job.submit()
    nodes = (["h1", "h2"], ["h3", "h4"])
    rounds = [job.usr1_round(r + 1, away=nodes[r % 2]) for r in range(reps)]
    job.cancel()
    return launch, rounds


def pmi_fences(slurm):
    """The fences of a short srun ring (one rank per node: MPICH over UCX
    may hang in MPI_Finalize with two, openucx/ucx#8738) requeued once
    onto other nodes, and let end."""
    ring = REPO / "integration" / "mpi" / "bin" / "mpich" / "ring"
    job = BatchJob(slurm, ["srun", "-N", "2", "-n", "2", "--mpi=pmi2", str(ring), "300", "10"],
                   "fences")
    job.submit()
    slurm.check("h1", ["scancel", "--signal=USR1", "--batch", job.id])
    job.until("pending", lambda: job.state() == "PENDING")
    slurm.check("h1", ["scontrol", "update", f"JobId={job.id}", "ExcNodeList=h1,h2"])
    job.until("end", lambda: job.trace.exists() and
              job.trace.read_text().count("<<local cmd=finalize_ack") == 2, timeout=180)
    job.cancel()
    return job.fences()


def pmix_calls(slurm):
    """The PMIx fences and gets of a short srun --mpi=pmix ring of Open MPI,
    two ranks per node, requeued once onto other nodes, and let end."""
    ring = REPO / "integration" / "mpi" / "bin" / "openmpi" / "ring"
    job = BatchJob(slurm, ["srun", "-N", "2", "-n", "4", "--mpi=pmix", str(ring), "600", "10"],
                   "pmix-fences")
    job.submit()
    slurm.check("h1", ["scancel", "--signal=USR1", "--batch", job.id])
    job.until("pending", lambda: job.state() == "PENDING")
    slurm.check("h1", ["scontrol", "update", f"JobId={job.id}", "ExcNodeList=h1,h2"])
    job.until("end", lambda: job.state() in ("COMPLETED", "FAILED", "CANCELLED", None),
              timeout=180)
    if "PASS" not in job.text():
        raise RuntimeError(f"slurm bench: the PMIx ring did not pass:\n{job.text()}")
    return job.pmix_calls()


def fence_rows(relayed, local, calls):
    """The PMI layer's calls before and after a restart; each after-restart
    figure's ratio is to its before-restart one (before / after)."""
    def row(what, values, baseline):
        if not values:
            return [what, 0, "-", "", ""]
        ratio = f"{baseline / statistics.median(values):.2f}" if baseline else "1.00"
        return [what, len(values), f"{statistics.median(values):.2f}",
                "itself" if not baseline else "before", ratio]
    rows = [row("PMI-2 barrier, relayed to slurmstepd (before)", relayed, None),
            row("PMI-2 barrier, ckpt's name service (after)", local,
                statistics.median(relayed) if relayed else None)]
    for call in ("fence", "get"):
        before, after = calls.get((call, "server"), []), calls.get((call, "local"), [])
        rows += [row(f"PMIx {call}, libpmix and slurmstepd (before)", before, None),
                 row(f"PMIx {call}, plugin and name service (after)", after,
                     statistics.median(before) if before else None)]
    return rows


def run(slurm, mib, reps):
    total = 4 * mib
    data = slurm.cluster.shared_dir / "baseline.bin"
    writes, reads = [], []
    for _ in range(reps):
        writes.append(baseline("write", data, total))
        reads.append(baseline("read", data))
        data.unlink()
    med = statistics.median
    bw, br = med(writes), med(reads)
    results = {launcher: launcher_rounds(slurm, mib, reps, launcher) for launcher in LAUNCHERS}
    rows = []
    figures = {}
    for launcher, (launch, rounds) in results.items():
        written, back, running = (med(x[i] for x in rounds) for i in range(3))
        figures[launcher] = (written, back, running, launch)
        rows += [[f"{launcher}: USR1 -> checkpoint written", f"{written:.2f}", "write+fsync",
                  f"{bw:.2f}", f"{bw / written:.2f}"],
                 [f"{launcher}: USR1 -> allocation given back", f"{back:.2f}", "write+fsync",
                  f"{bw:.2f}", f"{bw / back:.2f}"],
                 [f"{launcher}: requeued start -> app running", f"{running:.2f}", "read",
                  f"{br:.2f}", f"{br / running:.2f}"],
                 [f"{launcher}: first start -> READY (launch)", f"{launch:.2f}", "", "", ""]]
    names = ("USR1 -> allocation given back", "requeued start -> app running",
             "first start -> READY (launch)")
    for srun, mpirun in PAIRS:
        for name, i in zip(names, (1, 2, 3)):
            s, m = figures[srun][i], figures[mpirun][i]
            rows.append([f"{srun}: {name}", f"{s:.2f}", f"{mpirun}", f"{m:.2f}", f"{m / s:.2f}"])
    table(f"Slurm batch job under ckpt slurm run, 2 nodes, 4 ranks x {mib} MiB, "
          f"median of {reps} requeues",
          ["what", "seconds", "baseline", "baseline s", "ratio"], rows)
    print(f"  baselines: write = one sequential write()+fsync of {total} MiB to the shared "
          "filesystem with no job running, read = read() of it back")
    for launcher, (_launch, rounds) in results.items():
        print(f"  {launcher}, all rounds, s: written {fmt([x[0] for x in rounds])}  given back "
              f"{fmt([x[1] for x in rounds])}  running again {fmt([x[2] for x in rounds])}")
    relayed, local = pmi_fences(slurm)
    calls = pmix_calls(slurm)
    table("PMI calls of srun jobs before and after a restart, call to answer: PMI-2 "
          "(MPICH, 2 ranks on 2 nodes), PMIx (Open MPI, 4 ranks on 2 nodes)",
          ["call", "count", "median ms", "baseline", "ratio"],
          fence_rows(relayed, local, calls))
    print("  a fence's time holds its wait for the job's slowest rank (MPI_Init's "
          "before, MPI_Finalize's after); ratio = before / after")


if __name__ == "__main__":
    main()
