"""What a verified restart costs (issue 37, ckpt/verify.py): the time to
fingerprint a job's processes at a checkpoint (they are parked: it adds to
the time the job is stopped) and to fingerprint and compare them at a
restart (before RESUME: it adds to the restart), on test programs of the
engine and on a process of 2 GiB (bench/apps/bigproc).  Medians of --reps.

    python3 bench/verify_bench.py [--reps 3] [--mib 2048] [--smoke]
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine_bench import bench_env

REPO = Path(__file__).resolve().parent.parent
APPS = REPO / "integration" / "apps" / "bin"
BENCH_APPS = REPO / "bench" / "apps" / "bin"


def ckpt(env, *args, check=True):
    return subprocess.run([sys.executable, "-m", "ckpt", *map(str, args)], env=env,
                          capture_output=True, text=True, check=check)


def wait_for(predicate, what, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise RuntimeError(f"timed out waiting for {what}")


def one_round(env, work, name, argv, n):
    job = f"{name}-{n}"
    out = work / f"{job}.out"
    with open(out, "w") as f:
        launcher = subprocess.Popen([sys.executable, "-m", "ckpt", "launch", "--job-id", job,
                                     "--ckpt-dir", work / "images", "--", *map(str, argv)],
                                    env=env, stdout=f, stderr=subprocess.DEVNULL)
    wait_for(lambda: "READY" in out.read_text(errors="replace"), f"{job} READY")
    time.sleep(0.3)
    path = Path(ckpt(env, "checkpoint", job, "--kill").stdout.strip().splitlines()[-1])
    launcher.wait()
    [taken] = path.glob("fingerprint-*.json")
    saved = json.loads(taken.read_text())
    items = sum(len(p) for p in saved["processes"].values())
    record = path.parent / f"verify-{path.name}.json"
    restart = subprocess.Popen([sys.executable, "-m", "ckpt", "restart", "--verify=warn", path],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: record.exists() or restart.poll() is not None, f"{job} verified")
    ckpt(env, "kill", job, check=False)
    restart.wait()
    verified = json.loads(record.read_text())
    return {"checkpoint_ms": saved["took_ns"] / 1e6, "restart_ms": verified["took_ns"] / 1e6,
            "processes": len(saved["processes"]), "items": items,
            "bytes": taken.stat().st_size, "differences": verified["differences"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--mib", type=int, default=2048)
    parser.add_argument("--smoke", action="store_true", help="one round, a 64 MiB process")
    args = parser.parse_args()
    reps, mib = (1, 64) if args.smoke else (args.reps, args.mib)
    subprocess.run(["make", "-s", "-C", REPO / "bench" / "apps"], check=True)
    programs = {
        "counter": [APPS / "counter", 100000, 10],
        "threads (5 threads)": [APPS / "threads", 100000, 5],
        "proctree (5 processes)": [APPS / "proctree", 100000, 10],
        "eventfds": [APPS / "eventfds", 100000, 10],
        f"bigproc {mib} MiB": [BENCH_APPS / "bigproc", mib],
    }
    with tempfile.TemporaryDirectory(prefix="verify-bench-") as tmp:
        work = Path(tmp)
        env = bench_env(work, CKPT_VERIFY="on")
        rows = []
        for name, argv in programs.items():
            results = [one_round(env, work, name.split()[0], argv, n) for n in range(reps)]
            med = {k: statistics.median(r[k] for r in results)
                   for k in ("checkpoint_ms", "restart_ms", "items", "bytes")}
            rows.append([name, str(results[0]["processes"]), f"{med['items']:.0f}",
                         f"{med['bytes'] / 1024:.0f}", f"{med['checkpoint_ms']:.1f}",
                         f"{med['restart_ms']:.1f}",
                         str(max(r["differences"] for r in results))])
    header = ["program", "procs", "items", "KiB", "at checkpoint ms", "at restart ms",
              "differences"]
    widths = [max(len(row[i]) for row in rows + [header]) for i in range(len(header))]
    print(f"Fingerprint cost (median of {reps}; restart: fingerprint and comparison)")
    for row in [header] + rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))


if __name__ == "__main__":
    main()
