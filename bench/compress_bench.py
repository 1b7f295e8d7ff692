"""Benchmark of compressed images (--compress none|zstd|auto), as a table.

For a process whose memory compresses (a smooth double field, text-like
records, half zero pages: bigproc's "mixed") and one whose memory does not
(pseudo-random words), each checkpointed in rounds with none, zstd and
auto (forked writes, the default): the time the application is stopped,
the time until the image is durable (published), the image's size, and the
restart time; ratios to `none` of the same round.  The `zstd -1 -T2` CLI
on the uncompressed image's bytes is the reference for size and speed.

    python3 bench/compress_bench.py [--mib 1024] [--reps 3] [--dir DIR]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_bench import BIN, REPO, checkpoint, ckpt, launch, restart_time, table  # noqa: E402

MODES = ("none", "zstd", "auto")


def zstd_cli(image):
    """(seconds, bytes) of `zstd -1 -T2` on the image's bytes (from the page cache)."""
    subprocess.run(["cat", image], stdout=subprocess.DEVNULL, check=True)
    t = time.monotonic()
    out = subprocess.run(["zstd", "-1", "-T2", "-c", image], stdout=subprocess.PIPE,
                         check=True).stdout
    return time.monotonic() - t, len(out)


def bench_kind(env, work, kind, mib, reps):
    job = f"z-{kind}"
    proc, out = launch(env, work, job, BIN / "bigproc", mib, mib, kind)
    stops = {m: [] for m in MODES}
    walls = {m: [] for m in MODES}
    sizes, images = {}, {}
    for round_ in range(reps):
        for mode in MODES[round_ % 3:] + MODES[:round_ % 3]:
            path, wall, info = checkpoint(env, job, "--compress", mode)
            stops[mode].append(info["stopped_ns"] / 1e9)
            walls[mode].append(wall)
            sizes[mode] = info["size"]
            images[mode] = path
    ckpt(env, "kill", job)
    proc.wait()
    restarts = {m: [] for m in MODES}
    for _ in range(reps):
        for mode in MODES:
            subprocess.run(["sync"], check=True)
            seconds, rproc = restart_time(env, images[mode], out)
            restarts[mode].append(seconds)
            ckpt(env, "kill", job)
            rproc.wait()
            time.sleep(1)   # let the killed process's memory go back
    cli_s, cli_bytes = zstd_cli(images["none"] / next(
        p.name for p in images["none"].iterdir() if p.suffix == ".img"))
    med = statistics.median
    rows = []
    for mode in MODES:
        rows.append([mode, f"{med(stops[mode]):.3f}", f"{med(walls[mode]):.2f}",
                     f"{med([w / n for w, n in zip(walls[mode], walls['none'])]):.2f}",
                     f"{sizes[mode] / 2**20:.0f}", f"{sizes[mode] / sizes['none']:.2f}",
                     f"{med(restarts[mode]):.2f}",
                     f"{med([r / n for r, n in zip(restarts[mode], restarts['none'])]):.2f}"])
    rows.append(["zstd -1 -T2 (CLI)", "", f"{cli_s:.2f}", "", f"{cli_bytes / 2**20:.0f}",
                 f"{cli_bytes / sizes['none']:.2f}", "", ""])
    table(f"{kind} memory, {mib} MiB, checkpoint and restart by --compress (median of {reps}; "
          "ratios to none in the same round)",
          ["mode", "app stopped s", "durable s", "x none", "image MiB", "x none",
           "restart s", "x none"], rows)
    for mode in MODES:
        shutil.rmtree(images[mode], ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--dir", default=None, help="work dir (default: a temp dir in /tmp)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", choices=["mixed", "random"])
    args = ap.parse_args()
    subprocess.run(["make", "-s", "-C", REPO / "native"], check=True)
    subprocess.run(["make", "-s", "-C", REPO / "bench" / "apps"], check=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        env = dict(os.environ, PYTHONPATH=str(REPO), XDG_RUNTIME_DIR=str(work),
                   CKPT_CONFIG=str(work / "none.yaml"))
        print(f"ckpt compression benchmark, work dir {work}, {os.cpu_count()} CPUs")
        for kind in ("mixed", "random"):
            if args.only in (None, kind):
                bench_kind(env, work, kind, args.mib, args.reps)


if __name__ == "__main__":
    main()
