"""The CLI's side of the coordinator: one request, one reply line.  On the
job's own host over its Unix socket; from any other host over TCP, after
proving that we know the job's secret."""

import json
import socket

from ckpt import auth
from ckpt.errors import CkptError
from ckpt.jobs import find_job, is_local
from ckpt.wire import unescape

HANDSHAKE_TIMEOUT = 10.0


def _connect(job, timeout):
    """A connected socket to the job's coordinator, authenticated if TCP."""
    if is_local(job):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(job.socket)
        return sock
    host, _, port = job.address.rpartition(":")
    try:
        secret = auth.load_secret(job.secret_file)
    except auth.AuthError as exc:
        raise CkptError(f"job {job.job_id}: {exc}")
    sock = socket.create_connection((host, int(port)), timeout=HANDSHAKE_TIMEOUT)
    try:
        stream = sock.makefile("rwb")
        auth.client_handshake(stream, secret)
    except auth.AuthError as exc:
        sock.close()
        raise CkptError(f"job {job.job_id}: {exc}")
    sock.settimeout(timeout)
    return sock


def request(job, command, timeout=None):
    """Send `CLIENT <command>` to a job's coordinator; returns the OK value."""
    try:
        with _connect(job, timeout) as sock:
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


def checkpoint(job_id, kill=False, forked=None, compress=None):
    """Returns (checkpoint dir, warnings); forked, compress None: the job's default."""
    mode = {True: ["forked"], False: ["inplace"], None: []}[forked]
    mode += [f"compress={compress}"] if compress else []
    words = ["CHECKPOINT"] + (["kill"] if kill else []) + mode
    value = request(find_job(job_id), " ".join(words))
    path, *warnings = value.split(" ")
    return unescape(path), [unescape(w) for w in warnings]


def status(job, timeout=5.0):
    return json.loads(request(job, "STATUS", timeout=timeout))


def kill(job_id):
    request(find_job(job_id), "KILL", timeout=10.0)
