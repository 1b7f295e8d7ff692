"""Simulated host agents for the coordinator at scale: each stands for many
processes of its host and speaks the agent's side of docs/PROTOCOL.md
("Host agents") over authenticated TCP, as ckpt/agent.py does, answering
each request in one line for all of its processes.  No process exists: a
WRITE creates an empty image file per process, and no process is ever
stopped.  Used by bench/multihost_bench.py (in a process of its own:
`python3 -m tests.simulated_hosts ADDRESS SECRET_FILE HOSTS PER_HOST
[restored]`) and
by the coordinator's message-count test (in its own event loop).
"""

import asyncio
import json
import os
import sys

from ckpt import auth
from ckpt.wire import split_line, unescape

COMPACT = (",", ":")


def host_name(index):
    return f"sim{index:04d}"


def _answer(ident, answer):
    return f"ANSWERS {ident} {json.dumps(answer, separators=COMPACT)}\n".encode()


def _barrier_answer(host, pids, rest):
    """BARRIER id timeout tags PHASE name seq [arg]: the ANSWERS line."""
    ident, _timeout, tags, phase_line = rest.split(" ", 3)
    _, phase, _seq, *arg = phase_line.split(" ", 3)
    done = {}
    if phase == "SUSPEND":
        done = dict.fromkeys(tags.split(","), {"threads": "1"})
    elif phase == "WRITE":
        directory = unescape(arg[0].split(" ")[0])
        for tag in tags.split(","):
            image = f"{host}-{pids[tag]}.img"
            path = os.path.join(directory, image)
            # one system call: these hosts share the machine with the coordinator
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
            done[tag] = {"file": image, "size": "0", "xxh3": "0" * 16}
        # as ckpt/agent.py does before it answers (ckpt/image_check.py)
        for keys in done.values():
            if os.stat(os.path.join(directory, keys["file"])).st_size != int(keys["size"]):
                return _answer(ident, {"fail": f"image {keys['file']} has another size (on {host})"})
    elif phase == "RESUME":
        done = dict.fromkeys(tags.split(","), {"stopped_ns": "1000000"})
    # as ckpt/agent.py answers: "all" when no process has anything to say
    return _answer(ident, {"done": done, "fail": None} if done else {"all": True, "fail": None})


async def simulated_host(address, secret, host, first_pid, count, restored=False):
    """One host's agent with `count` processes (pids from first_pid; restored:
    as after a restart), until the coordinator closes the connection."""
    name, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(name, int(port), limit=1 << 24)
    try:
        await auth.client_handshake_async(reader, writer, secret)
        writer.write(f"AGENT {host} 1\n".encode())
        await reader.readline()   # WELCOME
        pids = {str(i + 1): first_pid + i for i in range(count)}
        writer.write("".join(f"JOIN {tag} {pid} {int(restored)} {host} {pid}\n"
                             for tag, pid in pids.items()).encode())
        while line := await reader.readline():
            word, rest = split_line(line)
            if word == "BARRIER":
                writer.write(_barrier_answer(host, pids, rest))
            elif word in ("STOPPED", "THAW"):    # STOPPED|THAW id tags: none is stopped
                writer.write(_answer(rest.partition(" ")[0], {"stopped": [], "fail": None}))
            elif word in ("FREEZE-APP", "FREEZE"):
                writer.write(_answer(rest.strip(), {"fail": None}))
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


def first_pid(host, per_host):
    return 100 + host * per_host


async def simulated_hosts(address, secret, hosts, per_host, restored=False):
    """`hosts` hosts of `per_host` processes each, until the coordinator closes."""
    await asyncio.gather(*(simulated_host(address, secret, host_name(h), first_pid(h, per_host),
                                          per_host, restored) for h in range(hosts)))


def main(argv):
    restored = argv[4:] == ["restored"]
    if len(argv) != 4 and not restored:
        print("usage: python3 -m tests.simulated_hosts ADDRESS SECRET_FILE HOSTS PER_HOST "
              "[restored]", file=sys.stderr)
        return 2
    address, secret_file, hosts, per_host = argv[:4]
    asyncio.run(simulated_hosts(address, auth.load_secret(secret_file), int(hosts),
                                int(per_host), restored))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
