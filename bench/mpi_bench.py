"""Benchmarks of MPI jobs under ckpt (issue 4), printed as tables.

  - checkpoint and restart of a 4-rank MPICH job with 512 MiB per rank, as
    ratios to writing and reading the same bytes on the same filesystem in
    the same run, and the application's stopped time;
  - checkpoint of a TCP connection kept full both ways (FLUSH), against
    the same two-process shape with little in flight;
  - runtime overhead of the shim on an MPI ping-pong and an allreduce loop.

    python3 bench/mpi_bench.py [--ranks 4] [--mib 512] [--reps 3] [--smoke]

--smoke: 2 ranks x 16 MiB, loops a hundredth as long, once: that the
benchmarks still run, in seconds.
"""
import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from engine_bench import REPO, baseline, bench_env, checkpoint, ckpt, fmt, launch, table

MPI_BIN = REPO / "bench" / "mpi" / "bin"


def restart_time(env, image_dir, out):
    """Seconds from `ckpt restart` until rank 0 writes again."""
    before = out.stat().st_size
    t = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "ckpt", "restart", image_dir], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while out.stat().st_size <= before:
        if proc.poll() is not None:
            raise RuntimeError("restart failed")
        time.sleep(0.002)
    return time.monotonic() - t, proc


def stop_job(env, job, proc):
    ckpt(env, "kill", job)
    proc.wait()
    time.sleep(1)       # let the killed ranks' memory go back


def bench_job(env, work, ranks, mib, reps):
    data = work / "baseline.bin"
    total_mib = ranks * mib
    argv = ["mpirun.mpich", "-np", ranks, MPI_BIN / "mpimem", mib]
    proc, out = launch(env, work, "mpi", *argv)
    base_write, walls, stops, sizes = [], [], [], []
    for _ in range(reps):
        base_write.append(baseline("write", data, total_mib))
        data.unlink()
        image_dir, wall, _info = checkpoint(env, "mpi")
        walls.append(wall)
        procs = yaml.safe_load((image_dir / "manifest.yaml").read_text())["processes"]
        stops.append(max(p["stopped_ns"] for p in procs) / 1e9)
        sizes.append(sum(p["size"] for p in procs))
    stop_job(env, "mpi", proc)
    base_read, restarts = [], []
    for _ in range(reps):
        baseline("write", data, total_mib)      # the same number of bytes to read back
        base_read.append(baseline("read", data))
        data.unlink()
        seconds, rproc = restart_time(env, image_dir, out)
        restarts.append(seconds)
        ckpt(env, "kill", "mpi")
        rproc.wait()
        time.sleep(1)
    med = statistics.median
    bw, br = med(base_write), med(base_read)
    table(f"{ranks}-rank MPICH job, {mib} MiB per rank (images {med(sizes) / 2**20:.0f} MiB "
          f"in all, median of {reps})",
          ["what", "seconds", "baseline s", "ratio (>=0.8)"],
          [["checkpoint, wall", f"{med(walls):.2f}", f"{bw:.2f}", f"{bw / med(walls):.2f}"],
           ["app stopped (slowest rank)", f"{med(stops):.2f}", "", ""],
           ["restart to running", f"{med(restarts):.2f}", f"{br:.2f}", f"{br / med(restarts):.2f}"]])
    print(f"  baselines: write = one sequential write()+fsync of {total_mib} MiB; "
          "read = read() of it back into fresh memory")
    print(f"  all runs, s: baseline write {fmt(base_write)}  checkpoint {fmt(walls)}  "
          f"baseline read {fmt(base_read)}  restart {fmt(restarts)}")


def checkpoint_figures(env, work, job, argv, reps):
    """Median checkpoint wall and stopped time, and image MiB, of a job."""
    proc, _out = launch(env, work, job, *argv)
    walls, stops, sizes = [], [], []
    for _ in range(reps):
        time.sleep(0.3)
        image_dir, wall, _info = checkpoint(env, job)
        procs = yaml.safe_load((image_dir / "manifest.yaml").read_text())["processes"]
        walls.append(wall)
        stops.append(max(p["stopped_ns"] for p in procs) / 1e9)
        sizes.append(sum(p["size"] for p in procs) / 2**20)
    stop_job(env, job, proc)
    med = statistics.median
    return med(walls), med(stops), med(sizes)


def bench_tcp_flush(env, work, reps):
    """FLUSH reads the megabytes a full TCP connection holds into the image
    and RESUME writes them back: the same two-process shape with little in
    flight (the sockets test program) is the baseline."""
    apps = REPO / "integration" / "apps" / "bin"
    jobs = [("idle connections (sockets)", "sockets", [apps / "sockets", 100000, 10, work]),
            ("TCP full both ways (tcpflood)", "tcpflood", [apps / "tcpflood", 100000, 10])]
    figures = [checkpoint_figures(env, work, job, argv, reps) for _, job, argv in jobs]
    base_wall = figures[0][0]
    table(f"Checkpoint of a TCP connection kept full both ways (2 processes, median of {reps})",
          ["job", "checkpoint wall s", "app stopped s", "images MiB", "wall / idle job's"],
          [[what, f"{wall:.2f}", f"{stop:.2f}", f"{mib:.1f}", f"{wall / base_wall:.2f}"]
           for (what, _, _), (wall, stop, mib) in zip(jobs, figures)])


def run_loop(env, kind, n, shim):
    argv = ["mpirun.mpich", "-np", "2", str(MPI_BIN / "mpiloops"), kind, str(n)]
    if shim:
        argv = [sys.executable, "-m", "ckpt", "launch", "--"] + argv
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    return float(out.split()[-1])


def bench_overhead(env, reps, scale=1):
    """Two ranks that busy-poll share this machine's 2 cores with everything
    else, so one run can take twice another: the best of several
    interleaved runs is the cost of the loop itself, the median shows the
    spread."""
    loops = {"pingpong": 2_000_000, "allreduce": 2_000_000}   # over a second each
    rows = []
    for kind, n in loops.items():
        n = max(1, int(n * scale))
        plain, shim = [], []
        for _ in range(reps):
            plain.append(run_loop(env, kind, n, False))
            shim.append(run_loop(env, kind, n, True))
        p, s = min(plain), min(shim)
        pm, sm = statistics.median(plain), statistics.median(shim)
        rows.append([kind, f"{n:,}", f"{p / n * 1e6:.2f}", f"{s / n * 1e6:.2f}", f"{s / p:.3f}",
                     f"{sm / pm:.3f}"])
    table(f"Runtime overhead of the shim on MPI (2 ranks, MPICH, {reps} interleaved runs each)",
          ["loop", "iterations", "plain us/op (best)", "under ckpt us/op (best)",
           "ratio of best (target <=1.02)", "ratio of medians"], rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--loop-reps", type=int, default=7, help="runs of each overhead loop")
    ap.add_argument("--only-overhead", action="store_true")
    ap.add_argument("--dir", default=None, help="work dir (default: a temp dir in /tmp)")
    ap.add_argument("--smoke", action="store_true", help="smallest sizes, once: does it still run (seconds; make bench-smoke)")
    args = ap.parse_args()
    if args.smoke:
        args.ranks, args.mib, args.reps, args.loop_reps = 2, 16, 1, 1
    if not shutil.which("mpirun.mpich"):
        print("mpi_bench: MPICH is not installed (./setup.sh installs it)")
        return
    for d in (REPO / "native", REPO / "bench" / "apps", REPO / "bench" / "mpi",
              REPO / "integration" / "apps"):
        subprocess.run(["make", "-s", "-C", d], check=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        env = bench_env(work)
        print(f"ckpt MPI benchmarks, work dir {work}")
        if not args.only_overhead:
            bench_job(env, work, args.ranks, args.mib, args.reps)
            bench_tcp_flush(env, work, args.reps)
        bench_overhead(env, args.loop_reps, 0.01 if args.smoke else 1)


if __name__ == "__main__":
    main()
