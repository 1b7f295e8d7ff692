"""Benchmarks of the checkpoint engine (issue 2), printed as tables.

Every figure is compared with a baseline measured in the same run on the
same filesystem, because absolute times drift on these machines:
  - checkpoint write throughput vs a plain sequential write + fsync of the
    same number of bytes, and DMTCP's checkpoint of the same program when
    it is installed (bench/dmtcp.py);
  - restart time vs reading the image's bytes back into fresh memory;
  - incremental checkpoints of a process that rewrites 5% of its pages
    between them vs full checkpoints of the same memory: bytes and time;
  - staged checkpoints (--stage-dir, default /dev/shm) vs checkpoints
    written straight to the checkpoint directory: app stopped, published;
  - a mostly untouched 8 GiB process: checkpoint time and image size;
  - runtime overhead of the shim on compute, syscall, clock, malloc, poll and
    epoll loops (timed waits go through the shim's wrappers);
  - how long a checkpoint stops a process whose threads are blocked in
    system calls, against the shim of an earlier commit (--baseline-ref,
    default: the previous commit that changed native/shim).

    python3 bench/engine_bench.py [--mib 2048] [--dir DIR] [--reps 5] [--only TABLE]
                                  [--stage-dir DIR] [--smoke]

--smoke: every table at its smallest size (64 MiB, loops a thousandth as
long, one thread; the stopped time against this shim itself unless
--baseline-ref is given), once: that the benchmarks still run, in seconds.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

import dmtcp as dmtcp_side

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / "bench" / "apps" / "bin"


def ckpt(env, *args, **kw):
    return subprocess.run([sys.executable, "-m", "ckpt", *map(str, args)], env=env,
                          capture_output=True, text=True, check=True, **kw)


def wait_for(path, text, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.01)
    raise RuntimeError(f"{path} never showed {text!r}")


def launch(env, work, job, *argv, options=()):
    out = work / f"{job}.out"
    f = open(out, "w")
    proc = subprocess.Popen([sys.executable, "-m", "ckpt", "launch", "--job-id", job,
                             "--ckpt-dir", work / "images", *options, "--", *map(str, argv)],
                            env=env, stdout=f, stderr=subprocess.DEVNULL)
    wait_for(out, "READY")
    return proc, out


def checkpoint(env, job, *extra):
    t = time.monotonic()
    path = Path(ckpt(env, "checkpoint", job, *extra).stdout.strip().splitlines()[-1])
    wall = time.monotonic() - t
    manifest = yaml.safe_load((path / "manifest.yaml").read_text())
    proc = manifest["processes"][0]
    return path, wall, proc


def kill(env, job, proc):
    ckpt(env, "kill", job)
    proc.wait()


def restart_time(env, image_dir, out):
    """Seconds from `ckpt restart` until the restored job writes again (it
    rewrites its output file from the checkpointed offset: watch the mtime)."""
    before = out.stat().st_mtime_ns
    t = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "ckpt", "restart", image_dir], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while out.stat().st_mtime_ns == before:
        if proc.poll() is not None:
            raise RuntimeError("restart failed")
        time.sleep(0.002)
    return time.monotonic() - t, proc


def baseline(*args):
    return float(subprocess.run([BIN / "io_baseline", *map(str, args)], check=True,
                                capture_output=True, text=True).stdout)


def table(title, header, rows):
    print(f"\n{title}")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  " + "  ".join(str(c).rjust(w) for c, w in zip(r, widths)))


def bench_big(env, work, mib, reps, dmtcp_bin):
    """Each round: a baseline write of the same size, a checkpoint as the
    default takes it (a forked writer), one --in-place, and DMTCP's of the
    same program when it is installed; then restarts interleaved with
    baseline reads: medians."""
    data = work / "baseline.bin"
    proc, out = launch(env, work, "big", BIN / "bigproc", mib)
    dmtcp = dmtcp_side.DmtcpJob(dmtcp_bin, work, [BIN / "bigproc", mib]) if dmtcp_bin else None
    base_write = []
    modes = {"default (forked)": (), "--in-place": ("--in-place",)}
    stops = {m: [] for m in [*modes, "dmtcp"]}
    walls = {m: [] for m in [*modes, "dmtcp"]}
    writes = {m: [] for m in modes}
    order = ["baseline", *modes] + (["dmtcp"] if dmtcp else [])
    for round_ in range(reps):
        # each round in another order: what runs first finds another disk
        for what in order[round_ % len(order):] + order[:round_ % len(order)]:
            if what == "baseline":
                base_write.append(baseline("write", data, mib))
                data.unlink()
                continue
            if what == "dmtcp":
                stopped, durable = dmtcp.checkpoint()
                stops[what].append(stopped)
                walls[what].append(durable)
                continue
            image_dir, wall, info = checkpoint(env, "big", *modes[what])
            stops[what].append(info["stopped_ns"] / 1e9)
            walls[what].append(wall)
            writes[what].append(info["write_ns"] / 1e9)
    kill(env, "big", proc)
    image = image_dir / info["image"]
    base_read, restarts, dmtcp_restarts = [], [], []
    for _ in range(reps):
        base_read.append(baseline("read", image))
        seconds, rproc = restart_time(env, image_dir, out)
        restarts.append(seconds)
        ckpt(env, "kill", "big")
        rproc.wait()
        time.sleep(1)   # let the killed process's memory go back
        if dmtcp:
            dmtcp_restarts.append(dmtcp.restart_time())
            time.sleep(1)
    if dmtcp:
        dmtcp.stop()
    med = statistics.median
    gib = info["size"] / 2**30
    bw, br = med(base_write), med(base_read)
    rows = []
    for mode in modes:
        # the disk's speed drifts from round to round: ratios within a round
        ratio = med([w / b for w, b in zip(walls[mode], base_write)])
        rows.append([mode, f"{med(stops[mode]):.3f}", f"{med(writes[mode]):.2f}",
                     f"{med(walls[mode]):.2f}", f"{bw:.2f}", f"{ratio:.2f}"])
    if dmtcp:
        ratio = med([w / b for w, b in zip(walls["dmtcp"], base_write)])
        rows.append([f"DMTCP {dmtcp_side.version(dmtcp_bin)} (no gzip; then sync)",
                     f"{med(stops['dmtcp']):.3f}", f"{med(stops['dmtcp']):.2f}",
                     f"{med(walls['dmtcp']):.2f}", f"{bw:.2f}", f"{ratio:.2f}"])
    table(f"Checkpoint of a {mib} MiB incompressible process (image "
          f"{info['size'] / 2**20:.0f} MiB, median of {reps})",
          ["mode", "app stopped s", "image written s", "published s", "baseline write s",
           "published/baseline, per round (<=1.1)"], rows)
    print("  published: `ckpt checkpoint` until the checkpoint is durable and `latest`; "
          "baseline: sequential write()+fsync of the same bytes")
    if dmtcp:
        print(f"  app stopped, ckpt's default / DMTCP's checkpoint: "
              f"{med(stops['default (forked)']) / med(stops['dmtcp']):.3f} (target <=0.05)")
    else:
        print("  DMTCP: not installed, left out (bench/dmtcp.py says how to add it)")
    print(f"  all rounds, s: baseline {fmt(base_write)}  " +
          "  ".join(f"{m}: stopped {fmt(stops[m])} published {fmt(walls[m])}" for m in stops
                    if stops[m]))
    rows = [["ckpt restart to running", f"{med(restarts):.2f}", f"{gib / med(restarts):.2f}",
             f"{br:.2f}", f"{br / med(restarts):.2f}"]]
    if dmtcp:
        rows.append(["DMTCP restart to running", f"{med(dmtcp_restarts):.2f}",
                     f"{gib / med(dmtcp_restarts):.2f}", f"{br:.2f}",
                     f"{br / med(dmtcp_restarts):.2f}"])
    table(f"Restart of that process (median of {reps})",
          ["what", "seconds", "GiB/s", "baseline read s", "ratio (>=0.8)"], rows)
    print("  baseline: read() of the image into fresh memory; "
          f"all runs, s: baseline {fmt(base_read)}  restart {fmt(restarts)}"
          + (f"  DMTCP {fmt(dmtcp_restarts)}" if dmtcp else ""))


def dirty_and_wait(pid, out, round_):
    """SIGUSR1: the program rewrites 5% of its pages and says so."""
    os.kill(pid, signal.SIGUSR1)
    wait_for(out, "DIRTIED", timeout=120)
    while out.read_text(errors="replace").count("DIRTIED") < round_:
        time.sleep(0.01)


def bench_incremental(env, work, mib, reps):
    """Two processes of the same memory, one after the other (beside a
    second one, a process's memory is read up to twice as slowly here:
    this machine runs DAMON's pageout over physical memory): one
    checkpointed in full, then one --incremental after each time it
    rewrote 5% of its pages: bytes and time of each."""
    full_proc, _ = launch(env, work, "full", BIN / "bigproc", mib)
    full_walls, full_sizes, full_writes = [], [], []
    for _ in range(reps):
        _, wall, info = checkpoint(env, "full")
        full_walls.append(wall)
        full_sizes.append(info["size"])
        full_writes.append(info["write_ns"] / 1e9)
    kill(env, "full", full_proc)
    inc_proc, inc_out = launch(env, work, "inc", BIN / "bigproc", mib, mib, "dirty",
                               options=["--incremental", "--full-every", "64"])
    _, first_wall, first = checkpoint(env, "inc")   # full, every page hashed
    inc_walls, inc_sizes, inc_stops, inc_writes = [], [], [], []
    for round_ in range(1, reps + 1):
        dirty_and_wait(first["pid"], inc_out, round_)
        image_dir, wall, info = checkpoint(env, "inc")
        inc_walls.append(wall)
        # its page list counts: it is written too
        inc_sizes.append(info["size"] + (image_dir / (info["image"] + ".pages")).stat().st_size)
        inc_stops.append(info["stopped_ns"] / 1e9)
        inc_writes.append(info["write_ns"] / 1e9)
    kill(env, "inc", inc_proc)
    seconds, rproc = restart_time(env, image_dir, inc_out)
    ckpt(env, "kill", "inc")
    rproc.wait()
    med = statistics.median
    size_ratio = med(inc_sizes) / med(full_sizes)
    time_ratio = med(inc_walls) / med(full_walls)
    table(f"Incremental checkpoints of a {mib} MiB incompressible process that rewrites "
          f"5% of its pages between them (median of {reps})",
          ["checkpoint", "app stopped s", "image written s", "published s", "image MiB",
           "bytes / full (<=0.07)", "time / full (<=0.15)"],
          [["full (no --incremental)", "", f"{med(full_writes):.2f}", f"{med(full_walls):.2f}",
            f"{med(full_sizes) / 2**20:.0f}", "1.00", "1.00"],
           ["first --incremental (full, hashes every page)",
            f"{first['stopped_ns'] / 1e9:.3f}", f"{first['write_ns'] / 1e9:.2f}",
            f"{first_wall:.2f}",
            f"{first['size'] / 2**20:.0f}", f"{first['size'] / med(full_sizes):.2f}",
            f"{first_wall / med(full_walls):.2f}"],
           ["--incremental after 5% changed (image + page list)", f"{med(inc_stops):.3f}",
            f"{med(inc_writes):.2f}", f"{med(inc_walls):.2f}",
            f"{med(inc_sizes) / 2**20:.0f}", f"{size_ratio:.3f}", f"{time_ratio:.3f}"]])
    print("  image written: by the writer, after the job resumed; published: the whole "
          "`ckpt checkpoint` command")
    print(f"  all rounds, s: full {fmt(full_walls)}  incremental {fmt(inc_walls)}; restart from "
          f"the last incremental (reads {mib} MiB from {reps + 1} checkpoints): {seconds:.2f} s")


def bench_staging(env, work, mib, reps, stage_root):
    """Two processes of the same memory side by side: one checkpointed
    straight into the checkpoint directory, the other with --stage-dir
    (node-local first, copied by ckpt-flush once the job resumed), each
    forked and in place, the order alternating per round: app stopped and
    time to published, ratios within a round.  Then a restart of each:
    the staged one reads the node-local copy."""
    import shutil
    stage = Path(stage_root) / f"ckpt-bench-{os.getpid()}"
    procs = {"direct": launch(env, work, "direct", BIN / "bigproc", mib),
             "staged": launch(env, work, "staged", BIN / "bigproc", mib,
                              options=["--stage-dir", stage])}
    modes = {"forked (default)": (), "--in-place": ("--in-place",)}
    stops, walls, copies, writes, last = {}, {}, {}, {}, {}
    try:
        for round_ in range(reps):
            for mode, extra in modes.items():
                for job in ("direct", "staged")[::1 if round_ % 2 == 0 else -1]:
                    last[job], wall, info = checkpoint(env, job, *extra)
                    stops.setdefault((job, mode), []).append(info["stopped_ns"] / 1e9)
                    walls.setdefault((job, mode), []).append(wall)
                    writes.setdefault((job, mode), []).append(info["write_ns"] / 1e9)
                    copies.setdefault((job, mode), []).append(info.get("flush_ns", 0) / 1e9)
        for job, (proc, _) in procs.items():
            kill(env, job, proc)
        restarts = {}
        for job, (_, out) in procs.items():
            restarts[job], rproc = restart_time(env, last[job], out)
            ckpt(env, "kill", job)
            rproc.wait()
            time.sleep(1)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    med = statistics.median
    rows = []
    for mode in modes:
        for job in ("direct", "staged"):
            ratio = med([s / d for s, d in zip(walls[("staged", mode)], walls[("direct", mode)])])
            rows.append([f"{mode}, {'--stage-dir ' + str(stage_root) if job == 'staged' else 'straight to the ckpt-dir'}",
                         f"{med(stops[(job, mode)]):.3f}", f"{med(writes[(job, mode)]):.2f}",
                         f"{med(copies[(job, mode)]):.2f}" if job == "staged" else "",
                         f"{med(walls[(job, mode)]):.2f}",
                         f"{ratio:.2f}" if job == "staged" else "1.00"])
    table(f"Staged checkpoints of a {mib} MiB incompressible process (median of {reps}, "
          "ratios within a round)",
          ["checkpoint", "app stopped s", "image written s", "copied s", "published s",
           "published / straight"], rows)
    print(f"  restart to running: from the staged copy {restarts['staged']:.2f} s, from the "
          f"ckpt-dir {restarts['direct']:.2f} s")


def fmt(values):
    return "/".join(f"{v:.2f}" for v in values)


def bench_sparse(env, work, mapped=8192, touched=64):
    proc, _ = launch(env, work, "sparse", BIN / "bigproc", mapped, touched)
    image_dir, wall, info = checkpoint(env, "sparse")
    kill(env, "sparse", proc)
    table(f"Untouched memory costs nothing: {mapped / 1024:g} GiB mapped, {touched} MiB touched",
          ["checkpoint wall s", "image write s", "image MiB", "touched MiB"],
          [[f"{wall:.3f}", f"{info['write_ns'] / 1e9:.3f}",
            f"{info['size'] / 2**20:.1f}", str(touched)]])


def run_loop(env, kind, n, shim):
    if not shim:
        argv = [BIN / "loops", kind, n]
        return float(subprocess.run(list(map(str, argv)), capture_output=True, text=True, check=True).stdout)
    proc = subprocess.run([sys.executable, "-m", "ckpt", "launch", "--", str(BIN / "loops"), kind,
                           str(n)],
                          env=env, capture_output=True, text=True, check=True)
    return float(proc.stdout)


def bench_overhead(env, reps, scale=1):
    loops = {"compute": 1_000_000_000, "syscalls": 3_000_000, "clock": 60_000_000,
             "malloc": 60_000_000, "poll": 5_000_000, "poll0": 5_000_000,
             "epoll": 5_000_000, "epoll0": 5_000_000}
    rows = []
    for kind, n in loops.items():
        n = max(1, int(n * scale))
        plain, shim = [], []
        for _ in range(reps):       # interleaved, so drift hits both alike
            plain.append(run_loop(env, kind, n, False))
            shim.append(run_loop(env, kind, n, True))
        p, s = statistics.median(plain), statistics.median(shim)
        rows.append([kind, f"{n:,}", f"{p:.3f}", f"{s:.3f}", f"{s / p:.3f}"])
    table("Runtime overhead of the shim (median of interleaved runs)",
          ["loop", "iterations", "plain s", "under ckpt s", "ratio (target <=1.01)"], rows)


def previous_shim_commit():
    commits = subprocess.run(["git", "-C", REPO, "log", "-n", "2", "--format=%h", "--",
                              "native/shim"], capture_output=True, text=True).stdout.split()
    return commits[1] if len(commits) > 1 else None


def build_baseline(ref, work):
    """native/ of commit ref, built in a worktree of its own: its directory."""
    tree = work / "baseline"
    subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", "-q", tree, ref],
                   check=True)
    for part in ("native", "plugins/ib"):   # preloaded alike in both runs
        subprocess.run(["make", "-s", "-C", tree / part], check=True, capture_output=True)
    return tree


def remove_baseline(tree):
    subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", tree],
                   capture_output=True)


def stopped_ms(env, work, job, threads, reps):
    proc, _ = launch(env, work, job, BIN / "parked", threads)
    stops = [checkpoint(env, job, "--in-place")[2]["stopped_ns"] / 1e6 for _ in range(reps)]
    kill(env, job, proc)
    return statistics.median(stops)


def bench_stopped(env, work, reps, ref, threads=(1, 16, 64)):
    """Stopped time of checkpoints (written in place) of processes whose
    threads are blocked in poll: this shim against the one of commit ref
    (the parking notes each thread's system call, and takes it up again).
    ref None: this shim against itself (--smoke: no worktree, no build)."""
    tree = build_baseline(ref, work) if ref else None
    baseline_name = f"shim of {ref}" if ref else "this shim itself"
    ref = ref or "baseline"
    try:
        base_env = dict(env, CKPT_NATIVE_DIR=str(tree / "native")) if tree else env
        rows = []
        for n in threads:
            base, now = [], []
            for i in range(reps):      # interleaved, so drift hits both alike
                base.append(stopped_ms(base_env, work, f"b{n}-{i}", n, 3))
                now.append(stopped_ms(env, work, f"n{n}-{i}", n, 3))
            b, c = statistics.median(base), statistics.median(now)
            rows.append([n, f"{b:.2f}", f"{c:.2f}", f"{c / b:.2f}"])
    finally:
        if tree:
            remove_baseline(tree)
    table(f"App stopped by a checkpoint, threads blocked in poll (median ms; baseline: "
          f"{baseline_name})", ["threads", f"{ref} ms", "this shim ms", "ratio"], rows)


def bench_env(work, **extra):
    """The environment a benchmark's ckpt commands run in: this checkout's
    ckpt, the job registry in the work dir, no user configuration, and the
    directories of jobs launched without --ckpt-dir in the work dir too
    (not in the caller's current directory); extra on top."""
    return dict(os.environ, PYTHONPATH=str(REPO), XDG_RUNTIME_DIR=str(work),
                CKPT_CONFIG=str(work / "none.yaml"), CKPT_DIR=str(work / "images"), **extra)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=2048)
    ap.add_argument("--dir", default=None, help="work dir (default: a temp dir in /tmp)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", choices=["big", "incremental", "staging", "overhead", "stopped"],
                    help="run one table only")
    ap.add_argument("--stage-dir", default="/dev/shm", help="node-local dir of the staging table")
    ap.add_argument("--dmtcp", default=None,
                    help="DMTCP's bin dir for the big table (default: on PATH or /opt/dmtcp/bin)")
    ap.add_argument("--baseline-ref", default=None,
                    help="commit whose shim the stopped-time table compares with")
    ap.add_argument("--smoke", action="store_true", help="smallest sizes, once: does it still run (seconds; make bench-smoke)")
    args = ap.parse_args()
    if args.smoke:
        args.mib, args.reps = 64, 1
    sparse = (512, 16) if args.smoke else (8192, 64)
    loop_scale = 0.001 if args.smoke else 1
    threads = (1,) if args.smoke else (1, 16, 64)
    subprocess.run(["make", "-s", "-C", REPO / "native"], check=True)
    subprocess.run(["make", "-s", "-C", REPO / "bench" / "apps"], check=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        env = bench_env(work)
        print(f"ckpt engine benchmarks, work dir {work}")
        if args.only in (None, "big"):
            bench_big(env, work, args.mib, args.reps, dmtcp_side.find(args.dmtcp))
        if args.only in (None, "incremental"):
            bench_incremental(env, work, args.mib, args.reps)
        if args.only in (None, "staging"):
            bench_staging(env, work, args.mib, args.reps, args.stage_dir)
        if not args.only:
            bench_sparse(env, work, *sparse)
        if args.only in (None, "overhead"):
            bench_overhead(env, args.reps, loop_scale)
        # --smoke: against itself unless a ref is given (no worktree to build)
        ref = args.baseline_ref or (None if args.smoke else previous_shim_commit())
        if args.only in (None, "stopped") and (ref or args.smoke):
            bench_stopped(env, work, args.reps, ref, threads)


if __name__ == "__main__":
    main()
