#!/usr/bin/env python3
"""softverbs benchmark: verbs over softverbs vs. a plain Unix-socket baseline.

Builds native/softverbs (the drop-in libibverbs.so.1) and two small C
programs (native/softverbs/bench/), then measures between two processes on
this host:

  * latency  : 8-byte ping-pong, one-way microseconds (RC and UD)
  * bandwidth: bursts of 32 messages + 8-byte reply, MB/s
               (RC 64 KiB; UD 4 KiB because a UD message cannot exceed
               the 4096-byte path MTU)

The baseline runs the same patterns over an AF_UNIX socketpair (stream and
datagram) with blocking I/O.  Each figure is the median of several runs.
Targets: latency within 2x of the baseline, bandwidth at least half.
--smoke: a few hundred iterations, once, and a missed target is no failure
(that the benchmark still runs: make bench-smoke).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SV = os.path.join(ROOT, "native", "softverbs")
SRC = os.path.join(SV, "bench")


def build(tmp):
    subprocess.run(["make", "-s", "-C", SV], check=True)
    for name, libs in (("svbench", ["-libverbs"]), ("unixbench", [])):
        subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-o",
                        os.path.join(tmp, name),
                        os.path.join(SRC, name + ".c")] + libs, check=True)


def parse(out):
    key, val = out.split()
    return float(val)


def run_verbs(tmp, transport, size, iters, window):
    env = dict(os.environ, LD_LIBRARY_PATH=SV,
               SOFTVERBS_DIR=os.path.join(tmp, "sv"))
    s_info, c_info = os.path.join(tmp, "s.info"), os.path.join(tmp, "c.info")
    for f in (s_info, c_info):
        if os.path.exists(f):
            os.unlink(f)
    exe = os.path.join(tmp, "svbench")
    args = [transport, str(size), str(iters), str(window)]
    srv = subprocess.Popen([exe, "server"] + args + [s_info, c_info], env=env,
                           stdout=subprocess.PIPE, text=True)
    cli = subprocess.run([exe, "client"] + args + [c_info, s_info], env=env,
                         stdout=subprocess.PIPE, text=True, timeout=120,
                         check=True)
    if srv.wait(timeout=60) != 0:
        raise RuntimeError("svbench server failed")
    return parse(cli.stdout)


def run_unix(tmp, kind, size, iters, window):
    out = subprocess.run([os.path.join(tmp, "unixbench"), kind, str(size),
                          str(iters), str(window)], stdout=subprocess.PIPE,
                         text=True, timeout=120, check=True).stdout
    return parse(out)


def median(fn, reps):
    return statistics.median(fn() for _ in range(reps))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--lat-iters", type=int, default=20000)
    ap.add_argument("--bw-iters", type=int, default=300)
    ap.add_argument("--smoke", action="store_true", help="smallest sizes, once: does it still run (seconds; make bench-smoke)")
    opts = ap.parse_args()
    if opts.smoke:
        opts.reps, opts.lat_iters, opts.bw_iters = 1, 500, 20

    with tempfile.TemporaryDirectory(prefix="svbench-") as tmp:
        build(tmp)
        L, B = opts.lat_iters, opts.bw_iters
        base = {
            "stream_lat": median(lambda: run_unix(tmp, "stream", 8, L, 0), opts.reps),
            "dgram_lat": median(lambda: run_unix(tmp, "dgram", 8, L, 0), opts.reps),
            "stream_bw64": median(lambda: run_unix(tmp, "stream", 65536, B, 32), opts.reps),
            "dgram_bw4": median(lambda: run_unix(tmp, "dgram", 4096, B * 4, 32), opts.reps),
        }
        rows = [
            # name, softverbs, baseline name, baseline, kind
            ("RC latency 8 B (us)",
             median(lambda: run_verbs(tmp, "rc", 8, L, 0), opts.reps),
             "unix stream", base["stream_lat"], "lat"),
            ("UD latency 8 B (us)",
             median(lambda: run_verbs(tmp, "ud", 8, L, 0), opts.reps),
             "unix dgram", base["dgram_lat"], "lat"),
            ("RC bandwidth 64 KiB (MB/s)",
             median(lambda: run_verbs(tmp, "rc", 65536, B, 32), opts.reps),
             "unix stream", base["stream_bw64"], "bw"),
            ("UD bandwidth 4 KiB (MB/s)",
             median(lambda: run_verbs(tmp, "ud", 4096, B * 4, 32), opts.reps),
             "unix dgram", base["dgram_bw4"], "bw"),
        ]

    ok = True
    print(f"{'test':<28} {'softverbs':>10} {'baseline':>10} {'(kind)':<12}"
          f" {'ratio':>6}  target")
    for name, sv, bname, b, kind in rows:
        if kind == "lat":
            ratio = sv / b
            good = ratio <= 2.0
            target = "<= 2.00x"
        else:
            ratio = sv / b
            good = ratio >= 0.5
            target = ">= 0.50x"
        ok &= good
        print(f"{name:<28} {sv:>10.2f} {b:>10.2f} {bname:<12} {ratio:>6.2f}"
              f"  {target} {'ok' if good else 'MISSED'}")
    return 0 if ok or opts.smoke else 1


if __name__ == "__main__":
    sys.exit(main())
