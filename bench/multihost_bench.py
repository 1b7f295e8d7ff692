"""Benchmarks of multi-host jobs (issue 11), printed as tables.

  - barrier scale: one checkpoint round (every phase, STOP to RESUME, the
    manifest and its publication; no image data) of the real coordinator,
    with 1,024 to 32,768 simulated processes on 16 to 512 simulated hosts.
    The hosts are lightweight agents in a process of their own, speaking
    the real protocol over TCP (authenticated): they answer each barrier
    for all of their processes at once, as a host's agent does, and write
    an empty image per process.  Target: under 1 s at 32,768.

    python3 bench/multihost_bench.py [--reps 3] [--only barrier]
"""
import argparse
import asyncio
import json
import os
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
from engine_bench import table  # noqa: E402

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
                               f"127.0.0.1:{coord.tcp_port}", str(secret_file), str(hosts),
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


def barrier_scale(reps):
    rows = []
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-", dir="/dev/shm") as tmp:
        for processes, hosts in SCALES:
            times = asyncio.run(barrier_round_times(processes, hosts, reps, Path(tmp)))
            median = statistics.median(times)
            rows.append([f"{processes:,}", str(hosts), f"{median:.3f}",
                         f"{min(times):.3f}", f"{median / processes * 1e6:.1f}",
                         "yes" if median < 1.0 else "no"])
    table("One checkpoint round of the coordinator with simulated hosts (no image data; "
          f"median of {reps})",
          ["processes", "hosts", "round s", "best s", "us per process", "under 1 s"], rows)


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "--simulate":
        address, secret_file, hosts, per_host = sys.argv[2:]
        asyncio.run(simulated_hosts(address, secret_file, int(hosts), int(per_host)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", choices=["barrier"])
    args = parser.parse_args()
    os.environ.setdefault("CKPT_SHARED_STATE_DIR", tempfile.mkdtemp(prefix="ckpt-bench-reg-"))
    barrier_scale(args.reps)


if __name__ == "__main__":
    main()
