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
(root).  Baselines of the same rounds, in a second table: cold, fio's
sequential read of the image file, cache dropped, at the engine, block
size and queue depth (a grid tried once first) that read it fastest on
this disk; warm, one memcpy of the image's bytes into fresh memory (its
page faults included, as a restore has them) and into touched memory.
The restore's time there is ckpt-restart's own, from its start to the
last page in, with two of its phases: the images checked and loaded, the
memory mapped and read.

    python3 bench/lazy_bench.py [--mib 256,2048] [--reps 3] [--dir DIR] [--cold] [--plain-only]
                                [--smoke]

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


FIO_GRID = [("psync", "128k", 1, 0), ("psync", "1M", 1, 0), ("psync", "4M", 1, 0),
            ("libaio", "1M", 8, 1), ("libaio", "1M", 32, 1), ("libaio", "4M", 8, 1),
            ("libaio", "4M", 32, 1)]


def fio_label(cfg):
    engine, bs, depth, direct = cfg
    return f"{engine} bs={bs} qd={depth}{' direct' if direct else ''}"


def fio_read(path, cfg):
    """Seconds fio's sequential read of the file takes (its own figure:
    bytes over bandwidth), page cache dropped before."""
    engine, bs, depth, direct = cfg
    drop_caches()
    out = subprocess.run(["fio", "--name=seq", f"--filename={path}", "--rw=read", f"--bs={bs}",
                          f"--iodepth={depth}", f"--ioengine={engine}", f"--direct={direct}",
                          "--readonly", "--output-format=json"],
                         check=True, capture_output=True, text=True).stdout
    read = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    return read["io_bytes"] / read["bw_bytes"]


def fio_best(path):
    """The block size, queue depth and engine at which fio reads the file
    fastest on this disk, cold: (config, seconds), or (None, None) without fio."""
    if not shutil.which("fio"):
        return None, None
    got = {cfg: fio_read(path, cfg) for cfg in FIO_GRID}
    for cfg, sec in got.items():
        print(f"  fio {fio_label(cfg)}: {sec:.3f} s")
    best = min(got, key=got.get)
    return best, got[best]


def memcpy_times(path):
    """(into fresh memory, into touched memory): seconds one memcpy of the
    file's bytes takes (bench/apps/io_baseline copy)."""
    out = subprocess.run([BIN / "io_baseline", "copy", path], check=True, capture_output=True,
                         text=True).stdout.split()
    return float(out[0]), float(out[1])


def restart_round(env, image, out, job, job_dir, mode, lazies):
    """One restart: (app running, last page in, inside ckpt-restart:
    resumed, last page, images loaded, memory read), seconds."""
    resume, start, rproc = one_restart(env, image, out, mode == "lazy")
    last = lazy_done_after(job_dir, start, lazies) if mode == "lazy" else resume
    ckpt(env, "kill", job)
    m = marks(rproc.communicate()[1])
    loaded = m["images checked and loaded"]
    inner_resume = m["memory restored"]
    inner_last = loaded + lazy_duration(job_dir, lazies) if mode == "lazy" else inner_resume
    return (resume, last, inner_resume, inner_last, loaded,
            inner_resume - m["in the new namespace"])


def bench_size(env, work, mib, reps, cold, modes):
    job = f"lazy-{mib}"
    proc, out = launch(env, work, job, BIN / "bigproc", mib, mib, "random")
    image, _, info = checkpoint(env, job, "--kill")
    proc.wait()
    job_dir = image.parent
    image_file = next(p for p in image.iterdir() if p.suffix == ".img")
    caches = ("warm", "cold") if cold else ("warm",)
    res = {(c, m): [] for c in caches for m in modes}
    fio_cfg, fio_grid = fio_best(image_file) if cold else (None, None)
    fio, copies = [], []
    lazies = 0
    for round_ in range(reps):
        for cache in caches:
            for mode in (modes if round_ % 2 == 0 else modes[::-1]):
                if cache == "cold":
                    drop_caches()
                else:
                    subprocess.run(["cat", image_file], stdout=subprocess.DEVNULL, check=True)
                lazies += mode == "lazy"
                res[(cache, mode)].append(restart_round(env, image, out, job, job_dir, mode,
                                                        lazies))
                time.sleep(0.5)   # the killed process's memory goes back
        if fio_cfg:
            fio.append(fio_read(image_file, fio_cfg))
        copies.append(memcpy_times(image_file))
    med = statistics.median
    size = f"{mib} MiB incompressible process, image {info['size'] / 2**20:.0f} MiB"
    rows = []
    for cache in caches:
        plain = res[(cache, "plain")]
        for mode in modes:
            got = res[(cache, mode)]
            row = [cache, mode]
            for i in range(4):
                row += [f"{med(g[i] for g in got):.3f}",
                        f"{med(g[i] / p[i] for g, p in zip(got, plain)):.2f}"]
            rows.append(row)
    table(f"{size}: restart by mode (median of {reps}; ratios to the plain restore of the "
          "same round)",
          ["cache", "mode", "app running s", "x plain", "last page in s", "x plain",
           "ckpt-restart: resumed s", "x plain", "last page s", "x plain"], rows)
    # the baselines: the disk's best sequential read, one memcpy of the bytes
    base = {"warm": [("memcpy into fresh memory", [c[0] for c in copies]),
                     ("memcpy into touched memory", [c[1] for c in copies])]}
    if fio:
        # the disk here is shared and varies: the grid's best trial too
        base["cold"] = [(f"fio {fio_label(fio_cfg)}", fio),
                        ("fio, that config's trial in the grid", [fio_grid] * len(fio))]
    rows = []
    for cache in caches:
        for name, times in base.get(cache, []):
            rows.append([cache, name, f"{med(times):.3f}", "", "", "", ""])
        for mode in modes:
            got = res[(cache, mode)]
            row = [cache, f"{mode}: all memory in (ckpt-restart)", f"{med(g[3] for g in got):.3f}",
                   f"{med(g[4] for g in got):.3f}", f"{med(g[5] for g in got):.3f}"]
            for _, times in base.get(cache, [])[:2]:
                row.append(f"{med(g[3] / t for g, t in zip(got, times)):.2f}")
            rows.append(row + [""] * (7 - len(row)))
    table(f"{size}: the restore against the baselines of the same rounds (median of {reps}; "
          "x: the restore's time over the baseline's, cold: fio in the rounds, in the grid; "
          "warm: memcpy fresh, touched)",
          ["cache", "what", "s", "images loaded s", "memory read s", "x base 1", "x base 2"],
          rows)
    shutil.rmtree(job_dir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", default="256,2048", help="process sizes, comma-separated")
    ap.add_argument("--dir", default=None, help="work dir (default: a temp dir in /tmp)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cold", action="store_true",
                    help="also with the page cache dropped (root), and fio's read of the image")
    ap.add_argument("--plain-only", action="store_true",
                    help="the plain restore alone, against the baselines")
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
            bench_size(env, work, mib, args.reps, args.cold,
                       ("plain",) if args.plain_only else ("plain", "lazy"))


if __name__ == "__main__":
    main()
