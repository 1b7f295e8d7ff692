"""A checkpoint directory's manifest.yaml and its atomic publication.

Layout: <ckpt-dir>/<job-id>/ckpt-NNNN/ (manifest.yaml + one image per
process), written as .ckpt-NNNN.tmp/ and renamed into place; `latest` is a
symlink to the newest published checkpoint.
"""

import json
import os
import re
import shutil
import socket
import time
from pathlib import Path

import yaml

from ckpt import ENGINE_VERSION
from ckpt.errors import CkptError

MANIFEST_NAME = "manifest.yaml"
MANIFEST_FORMAT = 1
LATEST = "latest"
CKPT_RE = re.compile(r"^ckpt-(\d{4,})$")
TMP_RE = re.compile(r"^\.ckpt-(\d{4,})\.tmp$")


def checkpoint_name(number):
    return f"ckpt-{number:04d}"


def tmp_name(number):
    return f".{checkpoint_name(number)}.tmp"


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


def build_manifest(*, job_id, number, command, processes, start_ns, end_ns,
                   restarted_from=None, warnings=(), addresses=None):
    """addresses: {host: its IPv4 address as the job's hosts reached it};
    `hosts` lists the coordinator's host first: a restart maps them in
    this order onto its new hosts."""
    here = socket.gethostname()
    seen = [proc["host"] for proc in processes]
    hosts = sorted(set(seen), key=lambda host: (host != here, seen.index(host))) or [here]
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
        "warnings": list(warnings),
        "processes": list(processes),
    }


def write_manifest(directory, manifest):
    """Written as JSON (which is YAML too), a process per line: PyYAML takes
    seconds for a manifest of tens of thousands of processes."""
    path = Path(directory) / MANIFEST_NAME
    head = {key: value for key, value in manifest.items() if key != "processes"}
    lines = [f" {json.dumps(key)}: {json.dumps(value)}," for key, value in head.items()]
    procs = ",\n  ".join(json.dumps(proc) for proc in manifest.get("processes", ()))
    with open(path, "w") as out:
        out.write("{\n" + "\n".join(lines) + f'\n "processes": [\n  {procs}\n ]\n}}\n')
        out.flush()
        os.fsync(out.fileno())
    return path


def _parse(text):
    try:
        return json.loads(text)
    except ValueError:
        return yaml.safe_load(text)  # an older manifest, or one written by hand


def read_manifest(directory):
    path = Path(directory) / MANIFEST_NAME
    try:
        data = _parse(path.read_text())
    except FileNotFoundError:
        raise CkptError(f"{directory}: not a checkpoint (no {MANIFEST_NAME})")
    except OSError as exc:
        raise CkptError(f"cannot read {path}: {exc.strerror}")
    except yaml.YAMLError:
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


def _check_manifest(data, path):
    if not isinstance(data, dict):
        raise CkptError(f"{path} is corrupt (not a mapping)")
    for key in ("format", "engine_version", "job_id", "checkpoint", "processes"):
        if key not in data:
            raise CkptError(f"{path} is corrupt (no {key})")
    if data["format"] != MANIFEST_FORMAT:
        raise CkptError(f"{path} has manifest format {data['format']}, this ckpt reads {MANIFEST_FORMAT}")
    processes = data["processes"]
    if not isinstance(processes, list) or not processes:
        raise CkptError(f"{path} is corrupt (no processes)")
    for proc in processes:
        if not isinstance(proc, dict) or not {"pid", "image", "size", "xxh3"} <= proc.keys():
            raise CkptError(f"{path} is corrupt (bad process entry)")
        if "/" in str(proc["image"]) or str(proc["image"]).startswith("."):
            raise CkptError(f"{path} is corrupt (bad image name {proc['image']!r})")


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
    """Delete the oldest published checkpoints beyond `keep` (0 = keep all)."""
    if keep <= 0:
        return []
    published = published_checkpoints(job_dir)
    victims = [path for _, path in published[:-keep]]
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
