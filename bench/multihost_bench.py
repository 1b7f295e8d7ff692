"""Benchmarks of multi-host jobs (issues 11 and 33), printed as tables.

  - barrier scale: one checkpoint round (every phase, STOP to RESUME, the
    manifest and its publication; no image data) of the real coordinator,
    with 1,024 to 131,072 simulated processes on 16 to 2,048 simulated
    hosts (64 per host).  The hosts (tests/simulated_hosts.py) are
    lightweight agents in a process of their own, speaking the real
    protocol over TCP (authenticated): they answer each request for all of
    their processes at once, as a host's agent does, and write an empty
    image per process.  Printed: the round's wall time, microseconds per
    process and their ratio to the smallest size of the same run, the
    coordinator's CPU time, and the messages it exchanged with the agents.
    Targets: 32,768 under 0.5 s, 131,072 under 2 s, the cost per process
    flat (ratio within 1.25).

  - a 2-host MPICH job on the test cluster (integration/cluster.py; root),
    4 ranks x 512 MiB: checkpoint and restart as ratios to writing and
    reading the same bytes on the same (shared) filesystem in the same run,
    and each rank's stopped time.  Target: ratios at least 0.8.

  - restart: the coordinator's side of a restart (its REBUILD, REFILL and
    RESUME rounds, once every restored process joined) with the same
    simulated hosts, up to 32,768 processes.  Target: flat per process.

  - history: the round at a job's checkpoint number 1, 10, 100 and 1,000
    (every checkpoint kept, --keep 5, --keep 5 incremental), 256 simulated
    processes on 4 hosts, as ratios to checkpoint 1.  Target: ratio 1.

  - names: a restart's cross-host connections (1,024 to 32,768) met
    through the coordinator's name service.  Target: flat per connection.

    python3 bench/multihost_bench.py [--reps 3] [--mib 512]
                                     [--only barrier|restart|history|names|job]
                                     [--scales 1024/16,8192/128,...] [--history N]
                                     [--profile FILE] [--smoke]

--profile FILE: the barrier rounds at the largest size sampled by py-spy
(raw stacks in FILE), summarised after the table: where the coordinator's
process spends a round.

--smoke: the smallest and a middle barrier size (1,024 processes on 16
hosts, 8,192 on 128), 20 checkpoints of history, 1,024 and 8,192
connections met, and a 16 MiB job, once: that the benchmark still runs,
in seconds (`make bench-smoke`).
"""
import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from ckpt import auth  # noqa: E402
from ckpt.coordinator import Coordinator, no_cycle_collection  # noqa: E402
from ckpt.names import NameService  # noqa: E402
from ckpt.write_mode import WriteMode  # noqa: E402
from engine_bench import baseline, fmt, table  # noqa: E402
from sampled_profile import SampledProfile  # noqa: E402

MPIMEM = REPO / "bench" / "mpi" / "bin" / "mpimem"
CKPT = str(REPO / "bin" / "ckpt")

SCALES = ((1024, 16), (8192, 128), (32768, 512), (131072, 2048))
SMOKE_SCALES = SCALES[:2]    # the smallest and a middle size
RESTART_MAX = 32768          # the restart's rounds: up to this size


# ---- the coordinator, timed, with simulated hosts -------------------------------

def parse_scales(text):
    """'1024/16,8192/128': [(processes, hosts)], each a multiple of its hosts."""
    scales = []
    for item in text.split(","):
        try:
            processes, hosts = (int(n) for n in item.split("/"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not PROCESSES/HOSTS")
        if hosts <= 0 or processes < hosts or processes % hosts:
            raise argparse.ArgumentTypeError(f"{item}: processes must be a multiple of hosts")
        scales.append((processes, hosts))
    return scales


async def barrier_rounds(processes, hosts, reps, work, restart=False, profile=None):
    """[(wall s, coordinator CPU s, messages)] of `reps` checkpoint rounds
    (restart: the restart's rounds, REBUILD, REFILL and RESUME, once every
    restored process joined; a new job each).  profile: a SampledProfile
    of the rounds (a checkpoint's only)."""
    rounds = []
    for _ in range(reps if restart else 1):
        rounds += await _rounds(processes, hosts, 1 if restart else reps, work, restart, profile)
    return rounds


async def _rounds(processes, hosts, reps, work, restart, profile=None):
    work = Path(tempfile.mkdtemp(dir=work))   # a job of its own
    job_dir = work / f"job-{processes}"
    secret_file = work / f"secret-{processes}"
    secret = auth.create_secret_file(secret_file)
    coord = Coordinator(job_id=f"sim{processes}", socket_path=work / f"c{processes}.sock",
                        job_dir=job_dir, command=["simulated"], secret=secret,
                        warn=lambda message: None, barrier_timeout=300)
    await coord.start()
    agents = subprocess.Popen([sys.executable, "-m", "tests.simulated_hosts",
                               f"{socket.gethostname()}:{coord.tcp_port}", str(secret_file), str(hosts),
                               str(processes // hosts)] + (["restored"] if restart else []),
                              cwd=REPO)
    try:
        if not await coord.wait_for_processes(processes, 600):
            raise RuntimeError(f"only {len(coord.live_processes())} processes joined")
        rounds = []
        with profile or contextlib.nullcontext():
            await _timed_rounds(coord, reps, restart, rounds)
        return rounds
    finally:
        await coord.close()
        agents.kill()
        agents.wait()


async def _timed_rounds(coord, reps, restart, rounds):
    for _ in range(reps):
        messages = sum(coord.agent_messages.values())
        start, cpu = time.perf_counter(), time.process_time()
        if restart:
            await coord.restart([p.pid for p in coord.live_processes()])
        else:
            await coord.checkpoint()
        rounds.append((time.perf_counter() - start, time.process_time() - cpu,
                       sum(coord.agent_messages.values()) - messages))


def barrier_scale(reps, scales, restart=False, profile_path=None):
    """profile_path: the rounds of the largest size sampled by py-spy into
    this file, and summarised after the table."""
    rows = []
    base = None
    profile = SampledProfile(profile_path) if profile_path else None
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-", dir="/dev/shm") as tmp:
        for processes, hosts in scales:
            largest = (processes, hosts) == max(scales)
            rounds = asyncio.run(barrier_rounds(processes, hosts, reps, Path(tmp), restart,
                                                profile if largest else None))
            walls = [wall for wall, _, _ in rounds]
            median = statistics.median(walls)
            cpu = statistics.median(c for _, c, _ in rounds)
            per_process = median / processes * 1e6
            base = base or per_process
            rows.append([f"{processes:,}", str(hosts), f"{median:.3f}", f"{min(walls):.3f}",
                         f"{per_process:.1f}", f"{per_process / base:.2f}", f"{cpu:.3f}",
                         f"{cpu / processes * 1e6:.1f}", str(rounds[0][2])])
    what = ("A restart's rounds (REBUILD, REFILL, RESUME, once every restored process "
            "joined)" if restart else "One checkpoint round") + " of the coordinator"
    table(f"{what} with simulated hosts (no image data; median of {reps})",
          ["processes", "hosts", "round s", "best s", "us/process", "ratio", "coord CPU s",
           "CPU us/process", "messages"], rows)
    print("  ratio: us per process against the first size of this run (target: within 1.25);\n"
          "  coord CPU: the coordinator's own process time in the round (the simulated hosts\n"
          "  run in another process on the same cores); messages: lines between the\n"
          "  coordinator and the agents in one round (2 per host and request).\n"
          + ("  Target: flat per process." if restart else
             "  Targets: 32,768 processes under 0.5 s, 131,072 under 2 s."))
    if profile:
        processes, hosts = max(scales)
        print(f"\nWhere the coordinator's process spent the rounds at {processes:,} processes "
              f"on {hosts} hosts (py-spy, its event loop's samples)")
        profile.print_summary(within="_run_once")


# ---- a long history: --keep and incremental parents ---------------------------

HISTORY = 1000          # checkpoints of one job
HISTORY_MARK_ROUNDS = 5  # rounds timed at each checkpoint number shown
HISTORY_SIZE = (256, 4)


async def history_rounds(label, count, work, keep, full_every):
    """The round times of checkpoints 1..count of one job (256 simulated
    processes on 4 hosts), kept `keep` (0: all), incremental every
    `full_every` (0: not)."""
    processes, hosts = HISTORY_SIZE
    work = work / label
    work.mkdir()
    secret_file = work / "secret"
    secret = auth.create_secret_file(secret_file)
    coord = Coordinator(job_id="history", socket_path=work / "c.sock", job_dir=work / "job",
                        command=["simulated"], secret=secret, warn=lambda message: None,
                        barrier_timeout=300, keep=keep, write_mode=WriteMode(full_every=full_every))
    await coord.start()
    agents = subprocess.Popen([sys.executable, "-m", "tests.simulated_hosts",
                               f"{socket.gethostname()}:{coord.tcp_port}", str(secret_file), str(hosts),
                               str(processes // hosts)], cwd=REPO)
    try:
        if not await coord.wait_for_processes(processes, 120):
            raise RuntimeError("the simulated processes did not join")
        times = []
        for _ in range(count):
            start = time.perf_counter()
            await coord.checkpoint()
            times.append(time.perf_counter() - start)
        return times
    finally:
        await coord.close()
        agents.kill()
        agents.wait()


def history_marks(count):
    """The checkpoint numbers the history table shows: 1, 10, 100, ...
    up to count, and count itself."""
    marks, n = [], 1
    while n <= count:
        marks.append(n)
        n *= 10
    return marks if marks[-1] == count else marks + [count]


def history(count):
    """A round at checkpoint 1,000 costs what it did at checkpoint 1: --keep
    pruning and the incremental parent's lookup do not grow with the job's
    history.  Each checkpoint number's figure is the median of the
    HISTORY_MARK_ROUNDS rounds from it (the last: up to it)."""
    modes = (("every one kept", 0, 0), ("--keep 5", 5, 0), ("--keep 5, incremental", 5, 8))
    marks = history_marks(count)
    columns = []
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-", dir="/dev/shm") as tmp:
        for label, keep, full_every in modes:
            times = asyncio.run(history_rounds(label.replace(" ", "_").replace(",", ""),
                                               count, Path(tmp), keep, full_every))
            columns.append([statistics.median(_mark_window(times, mark)) for mark in marks])
    rows = []
    for i, mark in enumerate(marks):
        row = [f"{mark:,}"]
        for column in columns:
            row += [f"{column[i] * 1e3:.1f}", f"{column[i] / column[0]:.2f}"]
        rows.append(row)
    processes, hosts = HISTORY_SIZE
    header = ["checkpoint"]
    for label, _, _ in modes:
        header += [f"{label} ms", "ratio"]
    table(f"{count:,} checkpoints of one job ({processes} simulated processes on {hosts} hosts): "
          f"the round at checkpoint number N (median of {HISTORY_MARK_ROUNDS} rounds)",
          header, rows)
    print("  ratio: against checkpoint 1 of the same job (target: 1).  incremental: "
          "--full-every 8 (the parent is looked up and read at each round).")


def _mark_window(times, mark):
    """The rounds from checkpoint `mark` on, or up to it at the end of the job."""
    start = min(mark - 1, len(times) - HISTORY_MARK_ROUNDS)
    return times[max(start, 0):][:HISTORY_MARK_ROUNDS]


# ---- a restart's connections met through the name service -------------------

MEETINGS = (1024, 8192, 32768)


async def meet(connections):
    """A restart's cross-host TCP connections met through the coordinator's
    name service (native/restart/state/cross_host.c): each end waits
    (MWAIT) for its peer's key, which the peer PUTs; requests arrive
    interleaved, as from many hosts."""
    names = NameService()
    start = time.perf_counter()
    with no_cycle_collection():      # as the coordinator during a restart
        await _meet(names, connections)
    return time.perf_counter() - start


async def _meet(names, connections):
    waits = [asyncio.ensure_future(names.answer("MWAIT", f"60 sock:1:{i}:peer"))
             for i in range(connections)]
    await asyncio.sleep(0)
    for i in range(connections):
        await names.answer("PUT", f"sock:1:{i}:peer 198.18.0.2:{i}")
        if i % 64 == 0:
            await asyncio.sleep(0)     # the waiters' turns come between requests
    answers = await asyncio.gather(*waits)
    if answers != [f"VAL 198.18.0.2:{i}" for i in range(connections)]:
        raise RuntimeError("a connection met the wrong peer")


def meetings(sizes):
    rows, base = [], None
    for connections in sizes:
        elapsed = asyncio.run(meet(connections))
        per = elapsed / connections * 1e6
        base = base or per
        rows.append([f"{connections:,}", f"{elapsed:.3f}", f"{per:.1f}", f"{per / base:.2f}"])
    table("A restart's cross-host connections met through the coordinator's name service "
          "(MWAIT for the peer's key, its PUT)", ["connections", "s", "us/connection", "ratio"], rows)


# ---- a real 2-host job on the test cluster ----------------------------------

def _wait_change(path, before, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while path.stat().st_mtime_ns == before:
        if proc.poll() is not None:
            raise RuntimeError("the restart failed")
        if time.monotonic() > deadline:
            raise RuntimeError("the restarted job never wrote")
        time.sleep(0.002)


class ClusterJob:
    def __init__(self, cluster, mib):
        self.cluster = cluster
        self.dir = cluster.shared_dir / "bench"
        self.dir.mkdir(exist_ok=True)
        self.out = self.dir / "job.out"
        self.env = dict(os.environ, **cluster.mpi_env("mpich"), PYTHONPATH=str(REPO),
                        CKPT_SHARED_STATE_DIR=str(self.dir / "registry"))
        self.env.pop("XDG_RUNTIME_DIR", None)
        self.argv = cluster.mpirun_args("mpich", ["h1", "h2"], 4) + [str(MPIMEM), str(mib)]

    def ckpt(self, *args):
        return subprocess.run([CKPT, *args], env=self.env, check=True, capture_output=True,
                              text=True, timeout=600).stdout.strip()

    def launch(self):
        with open(self.out, "w") as out:
            self.proc = self.cluster.popen("h1", [CKPT, "launch", "--job-id", "bench2", "--ckpt-dir",
                                                  str(self.dir / "img"), "--"] + self.argv,
                                           env=self.env, stdout=out, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while "READY" not in self.out.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the 2-host job did not start")
            time.sleep(0.05)

    def checkpoint(self):
        start = time.monotonic()
        path = Path(self.cluster.run("h1", [CKPT, "checkpoint", "bench2"], env=self.env,
                                     check=True, capture_output=True, text=True).stdout.strip())
        wall = time.monotonic() - start
        procs = json.loads((path / "manifest.yaml").read_text())["processes"]
        return path, wall, procs

    def restart(self, path):
        before = self.out.stat().st_mtime_ns
        start = time.monotonic()
        self.proc = self.cluster.popen("h1", [CKPT, "restart", str(path)], env=self.env,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_change(self.out, before, self.proc)
        return time.monotonic() - start

    def kill(self):
        self.cluster.run("h1", [CKPT, "kill", "bench2"], env=self.env, capture_output=True)
        self.proc.wait(timeout=60)
        for host in ("h1", "h2"):
            self.cluster.kill_all(host)
        time.sleep(1)       # the killed ranks' memory goes back


def drop_page_cache():
    """Written pages to disk, then every clean page out of memory (root)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def two_host_job(mib, reps):
    sys.path.insert(0, str(REPO / "integration"))
    from cluster import Cluster, ClusterUnavailable
    try:
        cluster = Cluster(n=2).start()
    except ClusterUnavailable as exc:
        print(f"\n2-host job: skipped ({exc})")
        return
    try:
        _two_host_job(cluster, mib, reps)
    finally:
        cluster.stop()


def _two_host_job(cluster, mib, reps):
    """Each round pairs a measurement with its baseline taken moments
    before (the disk and the page cache drift a lot between minutes): a
    write+fsync of the job's bytes with no job running (MPICH's ranks
    busy-poll and would take the CPU it needs), then the job, its
    checkpoint, a read of the bytes back, and the restart."""
    job = ClusterJob(cluster, mib)
    data = job.dir / "baseline.bin"
    total = 4 * mib
    base_write, base_read, walls, stops, restarts = [], [], [], [], []
    cold_read, cold_restarts = [], []
    for _ in range(reps):
        base_write.append(baseline("write", data, total))
        data.unlink()
        job.launch()
        path, wall, procs = job.checkpoint()
        walls.append(wall)
        ranks = sorted((p for p in procs if p["size"] > mib << 19), key=lambda p: (p["host"], p["pid"]))
        stops.append([p["stopped_ns"] / 1e9 for p in ranks])
        job.kill()
        baseline("write", data, total)
        base_read.append(baseline("read", data))
        restarts.append(job.restart(path))
        job.kill()
        # cold: nothing in memory, as on new nodes after a node failure
        drop_page_cache()
        cold_read.append(baseline("read", data))
        data.unlink()
        drop_page_cache()
        cold_restarts.append(job.restart(path))
        job.kill()
    med = statistics.median
    write_ratio = med(b / w for b, w in zip(base_write, walls))
    read_ratio = med(b / r for b, r in zip(base_read, restarts))
    cold_ratio = med(b / r for b, r in zip(cold_read, cold_restarts))
    per_rank = [med(s[i] for s in stops) for i in range(len(stops[0]))]
    table(f"2-host MPICH job (h1, h2), 4 ranks x {mib} MiB, median of {reps} rounds",
          ["what", "seconds", "baseline s", "ratio (>=0.8)"],
          [["checkpoint, wall", f"{med(walls):.2f}", f"{med(base_write):.2f}", f"{write_ratio:.2f}"],
           ["restart to running, images cached", f"{med(restarts):.2f}", f"{med(base_read):.2f}",
            f"{read_ratio:.2f}"],
           ["restart to running, cold", f"{med(cold_restarts):.2f}", f"{med(cold_read):.2f}",
            f"{cold_ratio:.2f}"]]
          + [[f"rank {i} stopped", f"{s:.2f}", "", ""] for i, s in enumerate(per_rank)])
    print(f"  baselines: write = one sequential write()+fsync of {total} MiB to the shared "
          "filesystem, with no job running; read = read() of it back, from the page cache "
          "(cached) or with the page cache dropped (cold, as on new nodes: also dropped "
          "before that restart); each taken just before its measurement, ratio = median "
          "of the rounds' ratios")
    print(f"  all rounds, s: baseline write {fmt(base_write)}  checkpoint {fmt(walls)}  "
          f"baseline read {fmt(base_read)}  restart {fmt(restarts)}  cold read {fmt(cold_read)}  "
          f"cold restart {fmt(cold_restarts)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--only", choices=["barrier", "restart", "history", "names", "job"])
    parser.add_argument("--history", type=int, default=HISTORY, metavar="N",
                        help=f"checkpoints of the history benchmark (default {HISTORY})")
    parser.add_argument("--scales", type=parse_scales,
                        default=SCALES, metavar="P/H,P/H,...",
                        help="barrier sizes, processes/hosts (default: "
                             + ",".join(f"{p}/{h}" for p, h in SCALES) + ")")
    parser.add_argument("--profile", metavar="FILE",
                        help="sample the coordinator's rounds at the largest barrier size with "
                             "py-spy into FILE (raw stacks) and print where the time went")
    parser.add_argument("--smoke", action="store_true",
                        help="smallest sizes, once: does it still run (seconds)")
    args = parser.parse_args()
    scales = args.scales
    if args.smoke:
        args.reps, args.mib, scales, args.history = 1, 16, SMOKE_SCALES, 20
    os.environ.setdefault("CKPT_SHARED_STATE_DIR", tempfile.mkdtemp(prefix="ckpt-bench-reg-"))
    if args.only in (None, "barrier"):
        barrier_scale(args.reps, scales, profile_path=args.profile)
    if args.only in (None, "restart"):
        barrier_scale(args.reps, [s for s in scales if s[0] <= RESTART_MAX], restart=True)
    if args.only in (None, "history"):
        history(args.history)
    if args.only in (None, "names"):
        meetings(MEETINGS[:2] if args.smoke else MEETINGS)
    if args.only in (None, "job"):
        for part in ("mpi", "apps"):   # the job, and the baselines' io_baseline
            subprocess.run(["make", "-s", "-C", str(REPO / "bench" / part)], check=True)
        two_host_job(args.mib, args.reps)


if __name__ == "__main__":
    main()
