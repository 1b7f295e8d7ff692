"""Benchmark of lazy restarts (`ckpt restart --lazy`) against plain ones, as a table.

A process of MiB of incompressible memory (bench/apps/bigproc), checkpointed
once, restarted in rounds alternately plain and lazy (warm page cache):
the time from `ckpt restart` to the application running again (its first
output after the restart: it writes a line every 5 ms) and to the last
page of its memory in (plain: the same; lazy: the page server's
lazy_restore_done event); and the same two inside ckpt-restart, from its
start (CKPT_RESTART_TIMING: its memory restored, the point where the
process jumps back into its code; the last page in: the page server's
own time added to when it started); ratios to the plain restore of the
same round.
With --cold, each restart also runs after `echo 3 > /proc/sys/vm/drop_caches`
(root), next to fio's sequential read of the image's bytes, cache dropped
too (fio where installed).

    python3 bench/lazy_bench.py [--mib 256,2048] [--reps 3] [--dir DIR] [--cold] [--smoke]

--smoke: 32 MiB, once: that the benchmark still runs.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_bench import BIN, REPO, bench_env, checkpoint, ckpt, launch, table  # noqa: E402

sys.path.insert(0, str(REPO))
from ckpt import events  # noqa: E402


def drop_caches():
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def lazy_done_after(job_dir, start, count, timeout=300):
    """Seconds from start to the count-th lazy_restore_done of the job."""
    deadline = time.monotonic() + timeout
    log = job_dir / "events.jsonl"
    while time.monotonic() < deadline:
        done = [json.loads(line) for line in log.read_text().splitlines()
                if '"lazy_restore_done"' in line] if log.exists() else []
        if len(done) >= count:
            return events.parse_time(done[count - 1]["time"]) - start
        time.sleep(0.005)
    raise RuntimeError("the last page never came")


def one_restart(env, image, out, lazy):
    """(seconds to the application's first output, the restart's process)."""
    before = out.stat().st_mtime_ns
    start, t = time.time(), time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "ckpt", "restart", *(["--lazy"] if lazy else []),
                             image], env=dict(env, CKPT_RESTART_TIMING="1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while out.stat().st_mtime_ns == before:
        if proc.poll() is not None:
            raise RuntimeError(f"restart {'--lazy ' if lazy else ''}failed")
        time.sleep(0.001)
    return time.monotonic() - t, start, proc


def marks(stderr):
    """{CKPT_RESTART_TIMING mark: its latest seconds from ckpt-restart's start}."""
    found = {}
    for line in stderr.splitlines():
        if line.startswith("ckpt-restart: ") and line.endswith(" ms"):
            what, _, ms = line[len("ckpt-restart: "):-3].rpartition(" ")
            found[what] = max(found.get(what, 0.0), float(ms) / 1000)
    return found


def lazy_duration(job_dir, count):
    done = [json.loads(line) for line in (job_dir / "events.jsonl").read_text().splitlines()
            if '"lazy_restore_done"' in line]
    return done[count - 1]["duration_s"]


def fio_read(path):
    """Seconds fio takes to read the file sequentially (1 MiB blocks,
    direct=0, cache dropped before), or None without fio."""
    if not shutil.which("fio"):
        return None
    drop_caches()
    t = time.monotonic()
    subprocess.run(["fio", "--name=seq", f"--filename={path}", "--rw=read", "--bs=1M",
                    "--iodepth=16", "--ioengine=libaio", "--direct=0", "--readonly"],
                   check=True, capture_output=True)
    return time.monotonic() - t


def bench_size(env, work, mib, reps, cold):
    job = f"lazy-{mib}"
    proc, out = launch(env, work, job, BIN / "bigproc", mib, mib, "random")
    image, _, info = checkpoint(env, job, "--kill")
    proc.wait()
    job_dir = image.parent
    image_file = next(p for p in image.iterdir() if p.suffix == ".img")
    caches = ("warm", "cold") if cold else ("warm",)
    res = {(c, m): [] for c in caches for m in ("plain", "lazy")}
    fio = []
    lazies = 0
    for round_ in range(reps):
        for cache in caches:
            for mode in (("plain", "lazy") if round_ % 2 == 0 else ("lazy", "plain")):
                if cache == "cold":
                    drop_caches()
                else:
                    subprocess.run(["cat", image_file], stdout=subprocess.DEVNULL, check=True)
                resume, start, rproc = one_restart(env, image, out, mode == "lazy")
                if mode == "lazy":
                    lazies += 1
                    last = lazy_done_after(job_dir, start, lazies)
                else:
                    last = resume
                ckpt(env, "kill", job)
                m = marks(rproc.communicate()[1])
                inner_resume = m["memory restored"]
                inner_last = (m["images checked and loaded"] + lazy_duration(job_dir, lazies)
                              if mode == "lazy" else inner_resume)
                res[(cache, mode)].append((resume, last, inner_resume, inner_last))
                time.sleep(0.5)   # the killed process's memory goes back
        if cold:
            fio.append(fio_read(image_file))
    med = statistics.median
    rows = []
    for cache in caches:
        plain = res[(cache, "plain")]
        for mode in ("plain", "lazy"):
            got = res[(cache, mode)]
            row = [cache, mode]
            for i in range(4):
                row += [f"{med(g[i] for g in got):.3f}",
                        f"{med(g[i] / p[i] for g, p in zip(got, plain)):.2f}"]
            rows.append(row)
        if cache == "cold" and fio and fio[0] is not None:
            rows.append(["cold", "fio seq read", "", "", f"{med(fio):.3f}",
                         f"{med(f / p[1] for f, p in zip(fio, plain)):.2f}", "", "", "", ""])
    table(f"{mib} MiB incompressible process, image {info['size'] / 2**20:.0f} MiB: "
          f"restart by mode (median of {reps}; ratios to the plain restore of the same round)",
          ["cache", "mode", "app running s", "x plain", "last page in s", "x plain",
           "ckpt-restart: resumed s", "x plain", "last page s", "x plain"], rows)
    shutil.rmtree(job_dir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", default="256,2048", help="process sizes, comma-separated")
    ap.add_argument("--dir", default=None, help="work dir (default: a temp dir in /tmp)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cold", action="store_true",
                    help="also with the page cache dropped (root), and fio's read of the image")
    ap.add_argument("--smoke", action="store_true",
                    help="32 MiB, once: does it still run (seconds; make bench-smoke)")
    args = ap.parse_args()
    if args.smoke:
        args.mib, args.reps = "32", 1
    subprocess.run(["make", "-s", "-C", REPO / "native"], check=True)
    subprocess.run(["make", "-s", "-C", REPO / "bench" / "apps"], check=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        env = bench_env(work)
        print(f"ckpt lazy restart benchmark, work dir {work}, {os.cpu_count()} CPUs")
        for mib in (int(m) for m in args.mib.split(",")):
            bench_size(env, work, mib, args.reps, args.cold)


if __name__ == "__main__":
    main()
