"""A checkpoint directory's manifest.yaml and its atomic publication.

A checkpoint directory holds manifest.yaml and one image per process; it
is written as .ckpt-NNNN.tmp/ and renamed into place, and `latest` links to
the newest published one (the paths: ckpt/paths.py).
"""

import json
import os
import re
import shutil
import socket
import stat
import time
from pathlib import Path

import yaml

from ckpt import ENGINE_VERSION
from ckpt.errors import CkptError
from ckpt.jobs import JOB_ID_RE
from ckpt.paths import CKPT_RE, LATEST, TMP_RE

MANIFEST_NAME = "manifest.yaml"
MANIFEST_FORMAT = 1

def published_checkpoints(job_dir):
    """[(number, path)] of published checkpoints, oldest first."""
    found = []
    try:
        names = os.listdir(job_dir)
    except FileNotFoundError:
        return []
    for name in names:
        match = CKPT_RE.match(name)
        if match and (Path(job_dir) / name / MANIFEST_NAME).is_file():
            found.append((int(match.group(1)), Path(job_dir) / name))
    return sorted(found)


def next_number(job_dir):
    """One more than any checkpoint number in use, finished or not."""
    highest = 0
    try:
        names = os.listdir(job_dir)
    except FileNotFoundError:
        return 1
    for name in names:
        match = CKPT_RE.match(name) or TMP_RE.match(name)
        if match:
            highest = max(highest, int(match.group(1)))
    return highest + 1


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY if Path(path).is_dir() else os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def incremental_parent(job_dir, full_every):
    """What an incremental checkpoint builds on: (the newest published
    checkpoint, the new one's place in its chain), or (None, 0) for a full
    one: none yet, or every full_every-th."""
    if full_every <= 1:  # not incremental (0), or every one full: no need to look
        return None, 0
    published = published_checkpoints(job_dir)
    if not published:
        return None, 0
    path = published[-1][1]
    try:
        chain = manifest_summary(path)["chain"]
    except CkptError:
        return None, 0
    if not _is_int(chain) or chain < 0 or chain + 1 >= full_every:
        return None, 0
    return path, chain + 1


def needed_checkpoints(manifest):
    """The earlier checkpoints whose images this one's refer to."""
    return {int(n) for n in manifest.get("needs") or () if _is_int(n)}


# What each checkpoint asks of its history (needs, chain), by manifest file:
# --keep and incremental parents look at kept checkpoints at every
# checkpoint, and a manifest of 100,000 processes takes half a second to
# read.  A file is known by its identity (a published checkpoint's manifest
# never changes; one rewritten by hand is read again).
_SUMMARIES_KEPT = 64
_summaries = {}


def _identity(info):
    return (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)


def _remember(identity, manifest):
    summary = {"needs": frozenset(needed_checkpoints(manifest)), "chain": manifest.get("chain", 0)}
    _summaries[identity] = summary
    while len(_summaries) > _SUMMARIES_KEPT:
        del _summaries[next(iter(_summaries))]
    return summary


def manifest_summary(directory):
    """{"needs": the checkpoints its images read, "chain": its place in its
    incremental chain} of a checkpoint, its manifest read once (CkptError
    as read_manifest)."""
    try:
        identity = _identity(os.lstat(Path(directory) / MANIFEST_NAME))
    except OSError:
        identity = None   # read_manifest says why
    if identity in _summaries:
        return _summaries[identity]
    manifest = read_manifest(directory)
    return _remember(identity, manifest) if identity else {
        "needs": frozenset(needed_checkpoints(manifest)), "chain": manifest.get("chain", 0)}


def build_manifest(*, job_id, number, command, processes, start_ns, end_ns,
                   restarted_from=None, warnings=(), addresses=None, parent=None,
                   full_every=0, stage_dir=None):
    """addresses: {host: its IPv4 address as the job's hosts reached it};
    `hosts` lists the coordinator's host first: a restart maps them in
    this order onto its new hosts."""
    here = socket.gethostname()
    # each host once, in the order its first process comes (a dict: a list's
    # index() per host made this hosts x processes)
    seen = list(dict.fromkeys(proc["host"] for proc in processes))
    needs = sorted({int(name.split("-")[1]) for proc in processes
                    for name in proc.get("sources", ())})
    hosts = sorted(seen, key=lambda host: host != here) or [here]
    return {
        "format": MANIFEST_FORMAT,
        "engine_version": ENGINE_VERSION,
        "job_id": job_id,
        "checkpoint": number,
        "command": list(command),
        "hosts": hosts,
        "addresses": {host: addr for host, addr in (addresses or {}).items() if host in hosts},
        "start_ns": start_ns,
        "end_ns": end_ns,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(end_ns / 1e9)),
        "restarted_from": restarted_from,
        # incremental: the checkpoint it was taken against, its place in
        # the chain since a full one, and the checkpoints it reads from
        "parent": parent if needs else None,
        "chain": max([proc.get("chain", 0) for proc in processes] + [0]),
        "needs": needs,
        "full_every": full_every,  # the job's --incremental --full-every; 0: not incremental
        # --stage-dir: each host kept a copy under <stage_dir>/<job>/ckpt-NNNN
        "stage_dir": stage_dir,
        "warnings": list(warnings),
        "processes": list(processes),
    }


def write_manifest(directory, manifest):
    """Written as JSON (which is YAML too), a process per line: PyYAML takes
    seconds for a manifest of tens of thousands of processes."""
    path = Path(directory) / MANIFEST_NAME
    head = {key: value for key, value in manifest.items() if key != "processes"}
    lines = [f" {json.dumps(key)}: {json.dumps(value)}," for key, value in head.items()]
    # one encoding of the whole list (a call per process costs half as much
    # again), then a line per process: `{"` never occurs inside a JSON
    # string, so this only ever changes white space outside them
    procs = json.dumps(list(manifest.get("processes", ())), check_circular=False)[1:-1]
    procs = procs.replace('}, {"pid": ', '},\n  {"pid": ')
    with open(path, "w") as out:
        out.write("{\n" + "\n".join(lines) + f'\n "processes": [\n  {procs}\n ]\n}}\n')
        out.flush()
        os.fsync(out.fileno())
        _remember(_identity(os.fstat(out.fileno())), manifest)   # kept across its rename
    return path


def _parse(text):
    try:
        return json.loads(text)
    except ValueError:
        return yaml.safe_load(text)  # an older manifest, or one written by hand


def read_manifest(directory):
    path = Path(directory) / MANIFEST_NAME
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise CkptError(f"{directory}: not a checkpoint (no {MANIFEST_NAME})")
    except OSError as exc:
        raise CkptError(f"cannot read {path}: {exc.strerror}")
    # a file of the checkpoint itself: not a link elsewhere, nor a FIFO that blocks
    if stat.S_ISLNK(info.st_mode):
        raise CkptError(f"{path} is a symbolic link (a manifest must be a file in its checkpoint directory)")
    if not stat.S_ISREG(info.st_mode):
        raise CkptError(f"{path} is not a regular file")
    try:
        data = _parse(path.read_text())
    except OSError as exc:
        raise CkptError(f"cannot read {path}: {exc.strerror}")
    except UnicodeDecodeError:
        raise CkptError(f"{path} is corrupt (not UTF-8 text)")
    except (yaml.YAMLError, RecursionError):
        raise CkptError(f"{path} is corrupt (not valid YAML)")
    _check_manifest(data, path)
    return data


def host_list(manifest):
    """The checkpoint's hosts in the order a restart maps them."""
    hosts = list(manifest.get("hosts") or [])
    for proc in manifest["processes"]:
        if proc.get("host") not in hosts:
            hosts.append(proc.get("host"))
    return hosts


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_str(value):
    """A name that fits in a one-line message."""
    return isinstance(value, str) and value != "" and value.isprintable()


def _is_str_list(value):
    return isinstance(value, list) and all(_is_str(item) for item in value)


def _is_command(value):
    return isinstance(value, list) and all(isinstance(word, str) for word in value)


# what each key must be, so nothing later trips over a type it did not expect
_MANIFEST_TYPES = {
    "job_id": (lambda v: isinstance(v, str) and JOB_ID_RE.match(v) is not None, "a job id"),
    "checkpoint": (lambda v: _is_int(v) and v >= 0, "a checkpoint number"),
    "engine_version": (_is_str, "a version"),
    "command": (_is_command, "a list of words"),
    "hosts": (_is_str_list, "a list of host names"),
    "addresses": (lambda v: isinstance(v, dict) and all(map(_is_str, [*v, *v.values()])),
                  "a mapping of hosts to addresses"),
    "restarted_from": (lambda v: v is None or (_is_int(v) and v >= 0), "a checkpoint number"),
    "parent": (lambda v: v is None or (_is_int(v) and v >= 0), "a checkpoint number"),
    "chain": (lambda v: _is_int(v) and v >= 0, "a number"),
    "full_every": (lambda v: _is_int(v) and 0 <= v <= 64, "a number up to 64"),
    "needs": (lambda v: isinstance(v, list) and all(_is_int(n) and n >= 0 for n in v),
              "a list of checkpoint numbers"),
    "warnings": (lambda v: isinstance(v, list) and all(isinstance(w, str) for w in v), "a list"),
    "stage_dir": (lambda v: v is None or (_is_str(v) and v.startswith("/")), "an absolute path"),
}
_PROCESS_TYPES = {
    "pid": (lambda v: _is_int(v) and 0 < v < 1 << 22, "a process id"),
    "host": (_is_str, "a host name"),
    "image": (_is_str, "a file name"),
    "size": (lambda v: _is_int(v) and v >= 0, "a size"),
    "xxh3": (lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-fA-F]{1,16}", v) is not None,
             "hex digits"),
}


def _check_manifest(data, path):
    if not isinstance(data, dict):
        raise CkptError(f"{path} is corrupt (not a mapping)")
    for key in ("format", "engine_version", "job_id", "checkpoint", "processes"):
        if key not in data:
            raise CkptError(f"{path} is corrupt (no {key})")
    if data["format"] != MANIFEST_FORMAT:
        raise CkptError(f"{path} has manifest format {data['format']!r:.40}, "
                        f"this ckpt reads {MANIFEST_FORMAT}")
    for key, (valid, meaning) in _MANIFEST_TYPES.items():
        if key in data and not valid(data[key]):
            raise CkptError(f"{path} is corrupt ({key} is not {meaning})")
    processes = data["processes"]
    if not isinstance(processes, list) or not processes:
        raise CkptError(f"{path} is corrupt (no processes)")
    for proc in processes:
        if not isinstance(proc, dict) or not set(_PROCESS_TYPES) <= proc.keys():
            raise CkptError(f"{path} is corrupt (bad process entry)")
        for key, (valid, meaning) in _PROCESS_TYPES.items():
            if not valid(proc[key]):
                raise CkptError(f"{path} is corrupt (process {key} is not {meaning})")
        name = proc["image"]
        # a plain name inside the checkpoint directory, no way out of it
        if "/" in name or name.startswith(".") or "\0" in name or not name.isprintable():
            raise CkptError(f"{path} is corrupt (bad image name {name[:80]!r})")
    if len({(proc["host"], proc["pid"]) for proc in processes}) != len(processes):
        raise CkptError(f"{path} is corrupt (a process is listed twice)")
    if len({proc["image"] for proc in processes}) != len(processes):
        raise CkptError(f"{path} is corrupt (an image is listed twice)")


def _sync_tree(directory):
    """The manifest and the directory: every process fsynced its own image
    before it answered WRITE (or SYNC), on whichever host it runs."""
    fsync_path(Path(directory) / MANIFEST_NAME)
    fsync_path(directory)


def update_latest(job_dir, target_name):
    """Point `latest` at target_name atomically (new symlink, then rename)."""
    job_dir = Path(job_dir)
    tmp = job_dir / f".{LATEST}.{os.getpid()}.tmp"
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
    os.symlink(target_name, tmp)
    os.replace(tmp, job_dir / LATEST)


def publish(tmp_dir, final_dir):
    """Make a fully written tmp checkpoint visible: fsync, rename, `latest`."""
    tmp_dir, final_dir = Path(tmp_dir), Path(final_dir)
    _sync_tree(tmp_dir)
    os.rename(tmp_dir, final_dir)
    fsync_path(final_dir.parent)
    update_latest(final_dir.parent, final_dir.name)
    fsync_path(final_dir.parent)
    return final_dir


def discard(tmp_dir):
    shutil.rmtree(tmp_dir, ignore_errors=True)


def prune(job_dir, keep):
    """Delete the oldest published checkpoints beyond `keep` (0 = keep all),
    never one whose images a kept checkpoint reads (incremental)."""
    if keep <= 0:
        return []
    published = published_checkpoints(job_dir)
    needed = set()
    for _, path in published[-keep:]:
        try:
            needed |= manifest_summary(path)["needs"]
        except CkptError:
            return []  # cannot tell what it needs: delete nothing
    victims = [path for number, path in published[:-keep] if number not in needed]
    for path in victims:
        # rename first so a half-deleted directory never looks valid
        doomed = path.with_name(f".{path.name}.deleting")
        try:
            os.rename(path, doomed)
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
    return victims


def resolve_checkpoint(path):
    """A checkpoint dir, or a job dir meaning its `latest`."""
    path = Path(path)
    if not path.exists():
        raise CkptError(f"{path}: no such file or directory")
    if not path.is_dir():
        raise CkptError(f"{path}: not a directory")
    if (path / MANIFEST_NAME).exists():
        return path.resolve()
    latest = path / LATEST
    if latest.is_symlink() or latest.exists():
        if not (latest / MANIFEST_NAME).exists():
            raise CkptError(f"{latest} does not lead to a checkpoint")
        return latest.resolve()
    published = published_checkpoints(path)
    if published:
        return published[-1][1].resolve()
    raise CkptError(f"{path}: no checkpoint here (neither {MANIFEST_NAME} nor {LATEST})")
