"""Per-user registry of running jobs: one JSON entry per job.

The state directory is `$CKPT_RUNTIME_DIR` (a job's node-local directory,
under Slurm), `$XDG_RUNTIME_DIR/ckpt` or `/tmp/ckpt-<uid>` (0700),
on the launcher's host.  An entry names the job's coordinator socket and its
launcher; entries whose launcher died are removed whenever the registry is
read.  A copy of each entry also goes to the shared registry
(`$CKPT_SHARED_STATE_DIR`, else `~/.local/state/ckpt/jobs`, on the
cluster's shared filesystem), so that the same user's CLI on any host finds
the coordinator's TCP address and the job's secret file.  A launcher that
was killed leaves its entries and secret behind: its own host removes them
(pid and start time tell), another host only once the coordinator's port
is refused or answered by someone without the job's secret.
"""

import dataclasses
import json
import os
import re
import secrets
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ckpt import auth
from ckpt.errors import CkptError

PROBE_TIMEOUT = 5.0  # another host's coordinator: connect and handshake
SUN_PATH_MAX = 107  # sockaddr_un.sun_path holds 108 bytes with the NUL
JOB_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,62}$")


@dataclass
class JobEntry:
    job_id: str
    socket: str
    launcher_pid: int
    command: list
    job_dir: str           # the job's directory: <ckpt-dir>/<job-id> (ckpt/paths.py)
    started: float = field(default_factory=time.time)
    restarted_from: str = ""
    launcher_start: int = 0  # /proc start time: tells a reused pid from ours
    host: str = ""         # the launcher's host
    address: str = ""      # the coordinator's TCP host:port
    secret_file: str = ""  # the job's secret, for TCP connections


def check_job_id(job_id):
    if not JOB_ID_RE.match(job_id):
        raise CkptError(
            f"invalid job id {job_id!r}: use up to 63 letters, digits, '.', '_' or '-'",
            exit_code=2,
        )
    return job_id


def _make_private_dir(path):
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not path.is_dir() or path.is_symlink() or info.st_uid != os.getuid():
        raise CkptError(f"state directory {path} is not a directory owned by you")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def state_dir(environ=None):
    """Create (0700) and return the state directory."""
    environ = os.environ if environ is None else environ
    runtime = environ.get("XDG_RUNTIME_DIR")
    candidates = []
    # a node-local directory for this job (Slurm's task prolog names it)
    job_runtime = environ.get("CKPT_RUNTIME_DIR")
    if job_runtime and os.path.isdir(job_runtime):
        candidates.append(Path(job_runtime))
    if runtime and os.path.isdir(runtime):
        candidates.append(Path(runtime) / "ckpt")
    candidates.append(Path(f"/tmp/ckpt-{os.getuid()}"))
    last = OSError(0, "no usable path")
    for candidate in candidates:
        # a socket path "<dir>/<pid>-<8 hex>.sock" must fit in sun_path
        if len(os.fsencode(candidate)) + 25 <= SUN_PATH_MAX:
            try:
                return _make_private_dir(candidate)
            except OSError as exc:
                last = exc
                continue
    raise CkptError(f"cannot create a state directory: {last.strerror}")


def shared_state_dir(environ=None):
    """The shared registry (0700), created on first use."""
    environ = os.environ if environ is None else environ
    path = environ.get("CKPT_SHARED_STATE_DIR") or Path.home() / ".local/state/ckpt/jobs"
    return _make_private_dir(Path(path))


def this_host():
    return socket.gethostname()


def socket_path_for(launcher_pid, directory=None):
    """New for every coordinator: on other hosts the job's agents serve the
    same path, and pids (a host's own pid namespace, say) repeat, so an
    agent of an earlier job must never be taken for this one's."""
    directory = directory if directory is not None else state_dir()
    return str(directory / f"{launcher_pid}-{secrets.token_hex(4)}.sock")


def _entry_path(job_id, directory):
    return directory / f"{job_id}.json"


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def process_start_time(pid):
    """Start time of pid in clock ticks since boot (0 if unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def launcher_alive(entry):
    if not pid_alive(entry.launcher_pid):
        return False
    return not entry.launcher_start or process_start_time(entry.launcher_pid) == entry.launcher_start


# An entry's file keeps its old key for job_dir: a ckpt of an earlier
# version on the same host reads the entries of this one (one it could not
# read it would remove as stale), and this one reads theirs.
JOB_DIR_ON_DISK = "ckpt_dir"


def _read_entry(path):
    try:
        fields = json.loads(path.read_text())
        if JOB_DIR_ON_DISK in fields and "job_dir" not in fields:
            fields["job_dir"] = fields.pop(JOB_DIR_ON_DISK)
        return JobEntry(**fields)
    except (OSError, ValueError, TypeError):
        return None


def _remove_stale(path, entry):
    """A dead launcher's entry, socket, secret and shared entry."""
    _unlink(path)
    if entry is not None:
        _unlink(entry.socket)
        forget_shared(entry)


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def forget_shared(entry):
    """Remove the job's shared entry if it is entry's (never a successor's),
    and entry's secret."""
    if entry.secret_file:
        _unlink(entry.secret_file)
    if not entry.address:
        return
    try:
        shared = _entry_path(entry.job_id, shared_state_dir())
    except (CkptError, OSError):
        return
    current = _read_entry(shared)
    if current is not None and (current.host, current.launcher_pid) == (entry.host, entry.launcher_pid):
        _unlink(shared)


def forget_job(job_id):
    """For a caller that knows job_id runs nowhere (Slurm runs a job id once
    at a time: a requeued run's predecessor is over, even if its host died
    and cannot say so): its shared entry and that entry's secret go."""
    try:
        shared = _entry_path(job_id, shared_state_dir())
    except (CkptError, OSError):
        return
    entry = _read_entry(shared)
    if entry is not None:
        forget_shared(entry)
    _unlink(shared)


def coordinator_gone(entry):
    """Whether another host's job surely ended: nothing listens on its
    coordinator's port, or what does cannot prove the job's secret.  A
    host that does not answer proves nothing."""
    host, _, port = entry.address.rpartition(":")
    try:
        secret = auth.load_secret(entry.secret_file)
    except (OSError, auth.AuthError):
        secret = None   # the port can still be refused
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT) as sock:
            if secret is not None:
                auth.client_handshake(sock.makefile("rwb"), secret)
    except (ConnectionRefusedError, auth.AuthError):
        return True
    except (OSError, ValueError):
        pass
    return False


def list_jobs(directory=None):
    """Running jobs, oldest first: this host's (stale entries are cleaned on
    the way), then those launched on other hosts (whose launchers cannot be
    checked from here)."""
    directory = directory if directory is not None else state_dir()
    jobs = []
    for path in sorted(directory.glob("*.json")):
        entry = _read_entry(path)
        if entry is None or not launcher_alive(entry):
            _remove_stale(path, entry)
            continue
        jobs.append(entry)
    local = {job.job_id for job in jobs}
    return sorted(jobs, key=lambda job: job.started) + [
        job for job in _other_hosts_jobs() if job.job_id not in local]


def _other_hosts_jobs():
    try:
        shared = shared_state_dir()
    except (CkptError, OSError):
        return []  # no shared home: only this host's jobs
    here = this_host()
    entries = (_read_entry(path) for path in sorted(shared.glob("*.json")))
    return sorted((e for e in entries if e is not None and e.host and e.host != here),
                  key=lambda job: job.started)


def is_local(job):
    """Launched on this host: reached on its Unix socket."""
    return not job.host or job.host == this_host()


def find_job(job_id, directory=None):
    for job in list_jobs(directory):
        if job.job_id == job_id:
            return job
    raise CkptError(f"no running job {job_id!r} (see `ckpt list`)")


def wait_until_gone(job_id, seconds, directory=None):
    """Give a job that is being killed a moment to unregister; True if gone."""
    deadline = time.monotonic() + seconds
    while True:
        if not any(job.job_id == job_id for job in list_jobs(directory)):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def refuse_if_running(job_id, directory=None):
    """A job id runs once: CkptError if it does.  Another host's entry
    whose coordinator is surely gone is removed (with its secret)."""
    directory = directory if directory is not None else state_dir()
    for other in list_jobs(directory):
        if other.job_id == job_id and not is_local(other) and coordinator_gone(other):
            forget_shared(other)
    if not wait_until_gone(job_id, 5.0, directory):
        other = find_job(job_id, directory)
        where = f" on {other.host}" if other.host else ""
        raise CkptError(f"job {job_id} is already running (launcher pid {other.launcher_pid}{where})")


def register(entry, directory=None):
    """Add a running job; refuse an id that is already running."""
    refuse_if_running(entry.job_id, directory)
    rewrite(entry, directory)


def rewrite(entry, directory=None):
    """Write a job's entry (atomically), e.g. when its coordinator moved to
    another process."""
    directory = directory if directory is not None else state_dir()
    _write_entry(entry, _entry_path(entry.job_id, directory))
    if entry.address:
        try:
            _write_entry(entry, _entry_path(entry.job_id, shared_state_dir()))
        except (CkptError, OSError):
            pass  # no shared home: the job is reached from this host only


def _write_entry(entry, path):
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fields = asdict(entry)
    fields[JOB_DIR_ON_DISK] = fields.pop("job_dir")
    tmp.write_text(json.dumps(fields))
    os.replace(tmp, path)


def unregister(entry, directory=None):
    directory = directory if directory is not None else state_dir()
    path = _entry_path(entry.job_id, directory)
    current = _read_entry(path)
    # only remove our own entry, never a successor's
    if current is not None and current.launcher_pid == entry.launcher_pid:
        _unlink(path)
    forget_shared(dataclasses.replace(entry, secret_file=""))  # the secret is the session's
    _unlink(entry.socket)
