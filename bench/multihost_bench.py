"""Benchmarks of multi-host jobs (issue 11), printed as tables.

  - barrier scale: one checkpoint round (every phase, STOP to RESUME, the
    manifest and its publication; no image data) of the real coordinator,
    with 1,024 to 32,768 simulated processes on 16 to 512 simulated hosts.
    The hosts are lightweight agents in a process of their own, speaking
    the real protocol over TCP (authenticated): they answer each barrier
    for all of their processes at once, as a host's agent does, and write
    an empty image per process.  Target: under 1 s at 32,768.

  - a 2-host MPICH job on the test cluster (integration/cluster.py; root),
    4 ranks x 512 MiB: checkpoint and restart as ratios to writing and
    reading the same bytes on the same (shared) filesystem in the same run,
    and each rank's stopped time.  Target: ratios at least 0.8.

    python3 bench/multihost_bench.py [--reps 3] [--mib 512] [--only barrier|job]
                                     [--smoke]

--smoke: the smallest size of each (1,024 processes on 16 hosts; a 16 MiB
job), once: that the benchmark still runs, in seconds (`make bench-smoke`).
"""
import argparse
import asyncio
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
from ckpt.coordinator import Coordinator  # noqa: E402
from ckpt.wire import split_line, unescape  # noqa: E402
from engine_bench import baseline, fmt, table  # noqa: E402

MPIMEM = REPO / "bench" / "mpi" / "bin" / "mpimem"
CKPT = str(REPO / "bin" / "ckpt")

SCALES = ((1024, 16), (8192, 128), (32768, 512))


# ---- the simulated hosts (a process of their own) -------------------------

async def simulated_host(address, secret, host, first_pid, count):
    name, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(name, int(port), limit=1 << 24)
    await auth.client_handshake_async(reader, writer, secret)
    writer.write(f"AGENT {host} 1\n".encode())
    await reader.readline()   # WELCOME
    pids = {str(i + 1): first_pid + i for i in range(count)}
    writer.write("".join(f"JOIN {tag} {pid} 0 {host} {pid}\n" for tag, pid in pids.items()).encode())
    while line := await reader.readline():
        word, rest = split_line(line)
        if word in ("STOPPED", "THAW"):     # STOPPED|THAW id tags
            # as ckpt/agent.py answers: the tags of the stopped (none here;
            # a thaw thaws none of them)
            ident = rest.partition(" ")[0]
            writer.write(f'ANSWERS {ident} {{"stopped":[],"fail":null}}\n'.encode())
            continue
        if word in ("FREEZE-APP", "FREEZE"):  # FREEZE-APP|FREEZE id
            writer.write(f'ANSWERS {rest.strip()} {{"fail":null}}\n'.encode())
            continue
        if word != "BARRIER":
            continue
        ident, _timeout, tags, phase_line = rest.split(" ", 3)
        _, phase, _seq, *arg = phase_line.split(" ", 3)
        done = {}
        for tag in tags.split(","):
            if phase == "SUSPEND":
                done[tag] = {"threads": "1"}
            elif phase == "WRITE":
                image = f"{host}-{pids[tag]}.img"
                Path(unescape(arg[0].split(" ")[0]), image).touch()
                done[tag] = {"file": image, "size": "0", "xxh3": "0" * 16}
            elif phase == "RESUME":
                done[tag] = {"stopped_ns": "1000000"}
        # as ckpt/agent.py answers: "all" when no process has anything to say
        answer = json.dumps({"done": done, "fail": None} if done else {"all": True, "fail": None},
                            separators=(",", ":"))
        writer.write(f"ANSWERS {ident} {answer}\n".encode())


async def simulated_hosts(address, secret_file, hosts, per_host):
    secret = auth.load_secret(secret_file)
    await asyncio.gather(*(simulated_host(address, secret, f"sim{h:03d}", 100 + h * per_host,
                                          per_host) for h in range(hosts)))


# ---- the coordinator, timed ---------------------------------------------------

async def barrier_round_times(processes, hosts, reps, work):
    job_dir = work / f"job-{processes}"
    secret_file = work / f"secret-{processes}"
    secret = auth.create_secret_file(secret_file)
    coord = Coordinator(job_id=f"sim{processes}", socket_path=work / f"c{processes}.sock",
                        job_dir=job_dir, command=["simulated"], secret=secret,
                        warn=lambda message: None, barrier_timeout=300)
    await coord.start()
    agents = subprocess.Popen([sys.executable, __file__, "--simulate",
                               f"{socket.gethostname()}:{coord.tcp_port}", str(secret_file), str(hosts),
                               str(processes // hosts)])
    try:
        if not await coord.wait_for_processes(processes, 120):
            raise RuntimeError(f"only {len(coord.live_processes())} processes joined")
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            await coord.checkpoint()
            times.append(time.perf_counter() - start)
        return times
    finally:
        await coord.close()
        agents.kill()
        agents.wait()


def barrier_scale(reps, scales=SCALES):
    rows = []
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-", dir="/dev/shm") as tmp:
        for processes, hosts in scales:
            times = asyncio.run(barrier_round_times(processes, hosts, reps, Path(tmp)))
            median = statistics.median(times)
            rows.append([f"{processes:,}", str(hosts), f"{median:.3f}",
                         f"{min(times):.3f}", f"{median / processes * 1e6:.1f}",
                         "yes" if median < 1.0 else "no"])
    table("One checkpoint round of the coordinator with simulated hosts (no image data; "
          f"median of {reps})",
          ["processes", "hosts", "round s", "best s", "us per process", "under 1 s"], rows)


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
    if len(sys.argv) == 6 and sys.argv[1] == "--simulate":
        address, secret_file, hosts, per_host = sys.argv[2:]
        asyncio.run(simulated_hosts(address, secret_file, int(hosts), int(per_host)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--only", choices=["barrier", "job"])
    parser.add_argument("--smoke", action="store_true",
                        help="smallest sizes, once: does it still run (seconds)")
    args = parser.parse_args()
    scales = SCALES
    if args.smoke:
        args.reps, args.mib, scales = 1, 16, SCALES[:1]
    os.environ.setdefault("CKPT_SHARED_STATE_DIR", tempfile.mkdtemp(prefix="ckpt-bench-reg-"))
    if args.only in (None, "barrier"):
        barrier_scale(args.reps, scales)
    if args.only in (None, "job"):
        for part in ("mpi", "apps"):   # the job, and the baselines' io_baseline
            subprocess.run(["make", "-s", "-C", str(REPO / "bench" / part)], check=True)
        two_host_job(args.mib, args.reps)


if __name__ == "__main__":
    main()
