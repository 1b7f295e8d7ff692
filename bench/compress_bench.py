"""Benchmark of compressed images (--compress none|zstd|auto), as a table.

For processes whose memory is incompressible (pseudo-random words), a
smooth double-precision field (a Jacobi grid), half zero pages (the rest
random) and a mix of what real programs hold (field, text-like records,
zero pages), each checkpointed in rounds with none, zstd and auto (forked
writes, the default): the time the application is stopped, the time until
the image is durable (published), the image's size, and the restart time;
ratios to `none` of the same round.  The `zstd -1 -T2` CLI on the
uncompressed image's bytes is the reference for size and speed: to a
pipe (compression alone), and to a file fsynced (durable, as ckpt's).

    python3 bench/compress_bench.py [--mib 2048] [--reps 3] [--dir DIR] [--only KIND]
                                    [--smoke]

--smoke: every kind at 32 MiB, once: that the benchmark still runs.
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
from engine_bench import BIN, REPO, bench_env, checkpoint, ckpt, launch, restart_time, table  # noqa: E402

MODES = ("none", "zstd", "auto")
KINDS = ("random", "field", "halfzero", "mixed")


def zstd_cli(image, out_dir):
    """(seconds to a pipe, seconds to a file fsynced, bytes) of `zstd -1 -T2`
    on the image's bytes (read from the page cache)."""
    subprocess.run(["cat", image], stdout=subprocess.DEVNULL, check=True)
    subprocess.run(["sync"], check=True)
    t = time.monotonic()
    out = subprocess.run(["zstd", "-1", "-T2", "-c", image], stdout=subprocess.PIPE,
                         check=True).stdout
    piped = time.monotonic() - t
    target = Path(out_dir) / "cli.zst"
    t = time.monotonic()
    subprocess.run(["zstd", "-q", "-f", "-1", "-T2", image, "-o", target], check=True)
    fd = os.open(target, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    durable = time.monotonic() - t
    target.unlink()
    return piped, durable, len(out)


def bench_kind(env, work, kind, mib, reps):
    job = f"z-{kind}"
    proc, out = launch(env, work, job, BIN / "bigproc", mib, mib, kind)
    stops = {m: [] for m in MODES}
    walls = {m: [] for m in MODES}
    sizes, images = {}, {}
    cli = {"pipe": [], "file": []}
    for round_ in range(reps):
        for mode in MODES[round_ % 3:] + MODES[:round_ % 3]:
            subprocess.run(["sync"], check=True)   # no writeback of the last one meanwhile
            path, wall, info = checkpoint(env, job, "--compress", mode)
            stops[mode].append(info["stopped_ns"] / 1e9)
            walls[mode].append(wall)
            sizes[mode] = info["size"]
            if mode in images:      # the page cache holds no more than a round's
                shutil.rmtree(images[mode])
            images[mode] = path
        # in the round: this disk's speed changes from minute to minute
        piped, durable, cli_bytes = zstd_cli(images["none"] / next(
            p.name for p in images["none"].iterdir() if p.suffix == ".img"), work)
        cli["pipe"].append(piped)
        cli["file"].append(durable)
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
    med = statistics.median
    rows = []
    for mode in MODES:
        rows.append([mode, f"{med(stops[mode]):.3f}", f"{med(walls[mode]):.2f}",
                     f"{med([w / n for w, n in zip(walls[mode], walls['none'])]):.2f}",
                     f"{sizes[mode] / 2**20:.0f}", f"{sizes[mode] / sizes['none']:.2f}",
                     f"{med(restarts[mode]):.2f}",
                     f"{med([r / n for r, n in zip(restarts[mode], restarts['none'])]):.2f}"])
    for name, key in (("zstd -1 -T2 (CLI), to a pipe", "pipe"),
                      ("zstd -1 -T2 (CLI), file + fsync", "file")):
        rows.append([name, "", f"{med(cli[key]):.2f}",
                     f"{med([c / n for c, n in zip(cli[key], walls['none'])]):.2f}",
                     f"{cli_bytes / 2**20:.0f}", f"{cli_bytes / sizes['none']:.2f}", "", ""])
    table(f"{kind} memory, {mib} MiB, checkpoint and restart by --compress (median of {reps}; "
          "ratios to none in the same round)",
          ["mode", "app stopped s", "durable s", "x none", "image MiB", "x none",
           "restart s", "x none"], rows)
    ratios = {key: med([c / z for c, z in zip(cli[key], walls["zstd"])]) for key in cli}
    print(f"{kind}: zstd's durable throughput is {ratios['pipe']:.2f} x the CLI's to a pipe, "
          f"{ratios['file']:.2f} x its to a file + fsync (same rounds); size "
          f"{sizes['zstd'] / cli_bytes:.3f} x its")
    for mode in MODES:
        shutil.rmtree(images[mode], ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=2048)
    ap.add_argument("--dir", default=None, help="work dir (default: a temp dir in /tmp)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", choices=KINDS)
    ap.add_argument("--smoke", action="store_true", help="smallest sizes, once: does it still run (seconds; make bench-smoke)")
    args = ap.parse_args()
    if args.smoke:
        args.mib, args.reps = 32, 1
    subprocess.run(["make", "-s", "-C", REPO / "native"], check=True)
    subprocess.run(["make", "-s", "-C", REPO / "bench" / "apps"], check=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        env = bench_env(work)
        print(f"ckpt compression benchmark, work dir {work}, {os.cpu_count()} CPUs")
        for kind in KINDS:
            if args.only in (None, kind):
                bench_kind(env, work, kind, args.mib, args.reps)


if __name__ == "__main__":
    main()
