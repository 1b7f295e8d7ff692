"""Load (issue 16): a checkpoint every second for ten minutes of a 16-rank
MPI job, for each stack, with `ckpt status` and `ckpt images` polled
meanwhile.  Reported: checkpoints taken and failed, whether the result
equals an uninterrupted run's, and the coordinator's memory and open fds
over the run (they must stay flat).

    python3 bench/load_bench.py [--minutes 10] [--ranks 16] [--stack mpich|openmpi]

The ring's result does not depend on its pace: the reference runs
without pauses; the checkpointed run is paced to last the given minutes
(calibrated on a short run of the same job under ckpt).
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from engine_bench import REPO, table

RING = {stack: REPO / "integration" / "mpi" / "bin" / stack / "ring" for stack in ("mpich", "openmpi")}
MPIRUN = {"mpich": ["mpirun.mpich"],
          "openmpi": ["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe"]}
PACE_MS = 20
POLL_SECONDS = 2.0
SAMPLE_SECONDS = 10.0


def ckpt_argv(*args):
    return [sys.executable, "-m", "ckpt", *map(str, args)]


def result_of(text):
    found = re.findall(r"^RESULT \S+$", text, re.M)
    return found[-1] if found else None


def mpi(stack, ranks, steps, pace):
    return MPIRUN[stack] + ["-np", str(ranks), str(RING[stack]), str(steps), str(pace)]


def reference(env, stack, ranks, steps):
    out = subprocess.run(mpi(stack, ranks, steps, 0), env=env, capture_output=True, text=True,
                         timeout=3600, check=True).stdout
    return result_of(out)


def steps_per_second(env, work, stack, ranks):
    """How fast the paced ring goes under ckpt, with a checkpoint a second
    (from READY to its end: start-up is not a step)."""
    steps = 300
    launched = subprocess.Popen(
        ckpt_argv("launch", "--job-id", f"calibrate-{stack}", "--ckpt-dir", work / "images",
                  "--interval", "1", "--keep", "2", "--", *mpi(stack, ranks, steps, PACE_MS)),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert launched.stdout.readline().strip() == "READY"
    start = time.monotonic()
    launched.communicate(timeout=1200)
    return steps / (time.monotonic() - start)


def coordinator_sample(pid):
    proc = psutil.Process(pid)
    return proc.memory_info().rss / 2**20, proc.num_fds()


def load_run(env, work, stack, ranks, minutes):
    rate = steps_per_second(env, work, stack, ranks)
    steps = max(100, int(rate * minutes * 60))
    want = reference(env, stack, ranks, steps)
    job = f"load-{stack}"
    out_path = work / f"{job}.out"
    err_path = work / f"{job}.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        launcher = subprocess.Popen(
            ckpt_argv("launch", "--job-id", job, "--ckpt-dir", work / "images", "--interval", "1",
                      "--keep", "2", "--", *mpi(stack, ranks, steps, PACE_MS)),
            env=env, stdout=out, stderr=err)
    samples, polls, poll_failures, taken = [], 0, 0, 0
    failure_lines = {}
    start = time.monotonic()
    # from the first checkpoint on: the coordinator is up and its job registered
    while launcher.poll() is None and not list((work / "images" / job).glob("ckpt-*")):
        time.sleep(0.05)
    next_sample = time.monotonic()
    while launcher.poll() is None:
        if time.monotonic() >= next_sample:
            try:
                samples.append(coordinator_sample(launcher.pid))
            except psutil.NoSuchProcess:
                break
            next_sample += SAMPLE_SECONDS
        for argv in (ckpt_argv("status", job), ckpt_argv("images", work / "images" / job)):
            polled = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
            polls += 1
            if polled.returncode != 0 and launcher.poll() is None:
                poll_failures += 1
                why = polled.stderr.strip().splitlines()[-1:] or ["(no message)"]
                failure_lines[f"{argv[3]}: {why[0]}"] = failure_lines.get(f"{argv[3]}: {why[0]}", 0) + 1
            match = re.search(r"checkpoints:\s+(\d+)", polled.stdout)
            if match:
                taken = max(taken, int(match.group(1)))
        time.sleep(POLL_SECONDS)
    elapsed = time.monotonic() - start
    status = launcher.wait()
    errors = err_path.read_text()
    failed = errors.count("periodic checkpoint failed")
    got = result_of(out_path.read_text())
    for line, count in failure_lines.items():
        print(f"  {stack}: {count} x {line}")
    rss = [s[0] for s in samples]
    fds = [s[1] for s in samples]
    return {
        "stack": stack, "minutes": f"{elapsed / 60:.1f}", "steps": steps,
        "checkpoints": taken, "per minute": f"{taken / (elapsed / 60):.0f}", "failed": failed, "status polls": polls,
        "poll failures": poll_failures, "result right": "yes" if got == want and status == 0 else "NO",
        "rss MiB first/last/max": f"{rss[0]:.1f}/{rss[-1]:.1f}/{max(rss):.1f}" if rss else "-",
        "fds first/last/max": f"{fds[0]}/{fds[-1]}/{max(fds)}" if fds else "-",
        "rss growth MiB/min": (f"{statistics.linear_regression(range(len(rss)), rss).slope * 60 / SAMPLE_SECONDS:.2f}"
                               if len(rss) > 2 else "-"),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--stack", choices=sorted(RING), action="append")
    args = parser.parse_args()
    stacks = [s for s in (args.stack or sorted(RING)) if shutil.which(MPIRUN[s][0]) and RING[s].exists()]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    rows = []
    with tempfile.TemporaryDirectory(prefix="ckpt-load-", dir="/var/tmp") as tmp:
        env["XDG_RUNTIME_DIR"] = tmp
        for stack in stacks:
            rows.append(load_run(env, Path(tmp), stack, args.ranks, args.minutes))
    header = list(rows[0]) if rows else []
    table(f"A checkpoint every second, {args.ranks} ranks of ring, `ckpt status` and "
          f"`ckpt images` polled every {POLL_SECONDS:g} s", header,
          [[str(r[h]) for h in header] for r in rows])
    print("  coordinator = the `ckpt launch` process; samples every "
          f"{SAMPLE_SECONDS:g} s; growth = least-squares slope of its RSS")


if __name__ == "__main__":
    main()
