"""The CLI's side of the coordinator socket: one request, one reply line."""

import json
import socket

from ckpt.errors import CkptError
from ckpt.jobs import find_job
from ckpt.wire import unescape


def request(job, command, timeout=None):
    """Send `CLIENT <command>` to a job's coordinator; returns the OK value."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(job.socket)
            sock.sendall(f"CLIENT {command}\n".encode())
            reply = sock.makefile("rb").readline().decode("utf-8", "replace").rstrip("\n")
    except socket.timeout:
        raise CkptError(f"job {job.job_id}: the coordinator did not answer")
    except OSError as exc:
        raise CkptError(f"job {job.job_id}: cannot reach its coordinator: {exc.strerror or exc}")
    word, _, value = reply.partition(" ")
    if word == "OK":
        return value
    if word == "ERR":
        raise CkptError(value or "the coordinator reported an error")
    raise CkptError(f"job {job.job_id}: the job ended before the coordinator answered")


def checkpoint(job_id, kill=False, forked=False):
    """Returns (checkpoint dir, warnings)."""
    words = ["CHECKPOINT"] + (["kill"] if kill else []) + (["forked"] if forked else [])
    value = request(find_job(job_id), " ".join(words))
    path, *warnings = value.split(" ")
    return unescape(path), [unescape(w) for w in warnings]


def status(job, timeout=5.0):
    return json.loads(request(job, "STATUS", timeout=timeout))


def kill(job_id):
    request(find_job(job_id), "KILL", timeout=10.0)
