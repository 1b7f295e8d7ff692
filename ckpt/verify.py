"""A restore that proves itself (issue 37): where fingerprints
(ckpt/fingerprint.py) are taken, stored and compared.

- At a checkpoint, after WRITE (every process parked, its image taken) and
  before RESUME or TERMINATE: each host's processes are fingerprinted on
  their host, from outside (the coordinator for its own host, the host's
  agent for any other), into `fingerprint-<host>.json` in the checkpoint's
  directory, written atomically.  A host whose fingerprint cannot be taken
  is a warning: the checkpoint itself is whole.
- At a restart, after REFILL and before RESUME: the same, compared with
  the checkpoint's file of the host each new host replaces.  A difference
  fails the restart in one line (`on`), is a warning (`warn`), or the
  comparison is not made (`off`, which also takes no fingerprint at a
  checkpoint).  Every difference goes to `verify-<checkpoint>.txt` in the
  job's directory.

Mode: `ckpt restart --verify`, the `verify` setting, CKPT_VERIFY."""

import asyncio
import json
import re
import os
import time
from pathlib import Path

from ckpt import fingerprint
from ckpt.barrier import PhaseError
from ckpt.jobs import this_host
from ckpt.wire import escape, unescape

MODES = ("on", "warn", "off")
AGENT_WORDS = ("FINGERPRINT", "VERIFY")
FILE_PREFIX = "fingerprint-"
ANSWER_DIFFERENCES = 20   # differences an agent sends back (all are in its count)


def file_name(host):
    return f"{FILE_PREFIX}{host}.json"


def kept(name):
    """Whether a file of a checkpoint's temporary directory is a fingerprint
    (kept when the checkpoint is published)."""
    return name.startswith(FILE_PREFIX) and name.endswith(".json")


def mode_of(coordinator):
    # a coordinator made by launch or restart has one; others (unit tests
    # drive coordinators of fake processes) take no fingerprint
    return getattr(coordinator, "verify_mode", "off")


def prepare(coordinator, mode, checkpoint_dir=None, mapping=None):
    """Called by launch (mode only) and restart (with the checkpoint it
    restores and its {old host: new host})."""
    coordinator.verify_mode = mode
    if checkpoint_dir is not None:
        coordinator.verify_restore = (Path(checkpoint_dir), dict(mapping or {}))


def _write_atomically(path, data):
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as out:
        json.dump(data, out, separators=(",", ":"))
        out.flush()
        os.fsync(out.fileno())
    os.rename(tmp, path)


def _take_into(path, host, processes):
    start = time.monotonic_ns()
    taken = fingerprint.take(processes)
    took = time.monotonic_ns() - start
    _write_atomically(path, {"format": fingerprint.FORMAT, "host": host, "took_ns": took,
                             "processes": taken})
    return took


def _load(path):
    with open(path) as f:
        data = json.load(f)
    if data.get("format") != fingerprint.FORMAT:
        raise ValueError(f"format {data.get('format')}, this ckpt reads {fingerprint.FORMAT}")
    return data["processes"]


def _other_format(path):
    """The format of a saved fingerprint that this ckpt does not compare
    (a checkpoint of another version of ckpt), or None."""
    # the file begins with its format (_take_into): its first bytes are
    # enough, not the whole of a big job's fingerprint
    try:
        with open(path, "rb") as f:
            head = f.read(64).decode("ascii", "replace")
    except OSError:
        return None     # the comparison itself says what is wrong
    match = re.match(r'\{"format": *(\d+)', head)
    found = int(match.group(1)) if match else None
    return None if found == fingerprint.FORMAT else found


def _compare_with(path, processes):
    """(differences, took_ns) of this host's processes against a saved file."""
    saved = _load(path)
    start = time.monotonic_ns()
    now = fingerprint.take(processes)
    took = time.monotonic_ns() - start
    return fingerprint.compare(saved, now), took


def _by_host(procs):
    local, remote = {}, {}
    for proc in procs:
        if proc.agent is None:
            local.setdefault(proc.host, []).append(proc)
        else:
            remote.setdefault(proc.agent, []).append(proc)
    return local, remote


def _agent_timeout(coordinator):
    return coordinator.barrier_timeout


# ---- at a checkpoint ---------------------------------------------------------


async def after_write(coord, procs, directory):
    """CheckpointRun's hook: fingerprints of the parked processes into the
    checkpoint's temporary directory."""
    if mode_of(coord) == "off":
        return
    loop = asyncio.get_running_loop()
    local, remote = _by_host([p for p in procs if p.alive])
    for host, procs in local.items():
        try:
            await loop.run_in_executor(None, _take_into, directory / file_name(host), host,
                                       [(p.pid, p.real_pid) for p in procs])
        except Exception as exc:  # noqa: BLE001 - a checkpoint never fails for it
            coord.note(f"no fingerprint of host {host} (the restart cannot verify it): "
                       f"{getattr(exc, 'strerror', None) or exc}")
    for link, procs in remote.items():
        tags = ",".join(p.tag for p in procs)
        try:
            await link._ask_or_fail("FINGERPRINT", f"{tags} {escape(directory / file_name(link.host))}",
                                    _agent_timeout(coord))
        except PhaseError as exc:
            coord.note(f"no fingerprint of host {link.host} (the restart cannot verify it): {exc}")


# ---- at a restart ----------------------------------------------------------------


async def before_resume(coord, procs):
    """Coordinator.restart's hook: compare every host's restored processes
    with the checkpoint's fingerprint; PhaseError (one line) in mode on."""
    mode = mode_of(coord)
    plan = getattr(coord, "verify_restore", None)
    if mode == "off" or plan is None:
        return
    checkpoint_dir, mapping = plan
    old_of = {new: old for old, new in mapping.items()}
    loop = asyncio.get_running_loop()
    differences, count, missing, took = [], 0, [], 0
    local, remote = _by_host(procs)
    for host, group in local.items():
        path = checkpoint_dir / file_name(old_of.get(host, host))
        if not path.is_file() or _other_format(path) is not None:
            missing.append(old_of.get(host, host))
            continue
        try:
            found, took_here = await loop.run_in_executor(
                None, _compare_with, path, [(p.pid, p.real_pid) for p in group])
            took += took_here
        except Exception as exc:  # noqa: BLE001 - one line, never a traceback
            raise PhaseError(f"verification: cannot compare with {path}: "
                             f"{getattr(exc, 'strerror', None) or exc}")
        found = [d for d in found if _expected(d, group)]
        differences += [fingerprint.describe(d) + _on(host, remote) for d in found]
        count += len(found)
    for link, group in remote.items():
        old_host = old_of.get(link.host, link.host)
        path = checkpoint_dir / file_name(old_host)
        if not path.is_file() or _other_format(path) is not None:
            missing.append(old_host)
            continue
        tags = ",".join(p.tag for p in group)
        answer = await link._ask_or_fail("VERIFY", f"{tags} {escape(path)}", _agent_timeout(coord))
        differences += [line + f" (on {link.host})" for line in answer.get("differences", [])]
        count += int(answer.get("count", 0))
    for host in missing:
        coord.warn(f"the checkpoint has no fingerprint of host {host} that this ckpt can "
                   f"compare (none, or of another version): its restore is not verified")
    _record(coord, checkpoint_dir, {"mode": mode, "differences": count, "took_ns": took,
                                    "hosts_missing": missing})
    if count:
        _report(coord, checkpoint_dir, mode, differences, count)


def _expected(difference, group):
    """A process of the checkpoint that did not come back on this host is
    the restart's own business (it waits for every process it expects):
    only the processes here are compared."""
    pid, item = difference[0], difference[1]
    if item == "process":
        return any(str(p.pid) == pid for p in group)
    return True


def _on(host, remote):
    return f" (on {host})" if remote else ""


def _record(coord, checkpoint_dir, summary):
    """`verify-<checkpoint>.json` in the job's directory: how the last
    restart of that checkpoint was verified (took_ns: this host's
    fingerprint and comparison)."""
    try:
        _write_atomically(Path(coord.job_dir) / f"verify-{checkpoint_dir.name}.json", summary)
    except OSError:
        pass


def _report(coord, checkpoint_dir, mode, differences, count):
    record = Path(coord.job_dir) / f"verify-{checkpoint_dir.name}.txt"
    try:
        record.write_text("".join(line + "\n" for line in differences)
                          + (f"... {count - len(differences)} more\n" if count > len(differences) else ""))
        where = f", all in {record}"
    except OSError:
        where = ""
    more = f" (and {count - 1} more difference{'s' if count > 2 else ''}{where})" if count > 1 else ""
    if mode == "on":
        raise PhaseError(f"the restored processes differ from the checkpoint: {differences[0]}{more}")
    # one line, as every warning: the file has them all
    coord.warn(f"restore differs: {differences[0]}{more}")


# ---- an agent, for its host ------------------------------------------------------


async def on_agent(agent, word, args):
    """FINGERPRINT tags path, VERIFY tags path: the agent's answer (a dict)."""
    tags, _, path = args.partition(" ")
    procs = [agent.procs[t] for t in tags.split(",") if t in agent.procs]
    processes = [(p.pid, p.real_pid) for p in procs]
    path = Path(unescape(path))
    loop = asyncio.get_running_loop()
    try:
        if word == "FINGERPRINT":
            await loop.run_in_executor(None, _take_into, path, this_host(), processes)
            return {}
        found, _took = await loop.run_in_executor(None, _compare_with, path, processes)
    except Exception as exc:  # noqa: BLE001
        # the agent's _answer sends a PhaseError as the request's failure
        raise PhaseError(f"fingerprint: {getattr(exc, 'strerror', None) or exc}")
    found = [d for d in found if _expected(d, procs)]
    return {"count": len(found),
            "differences": [fingerprint.describe(d) for d in found[:ANSWER_DIFFERENCES]]}
