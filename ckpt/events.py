"""A job's event log: <job-dir>/events.jsonl, one JSON object a line, one
line per checkpoint, restart and failure (the format: docs/EVENTS.md).

`ckpt status`, `ckpt list` and whatever a site builds on top read it.  A
line is appended with a single write(2) on an O_APPEND descriptor, so
lines of several writers never interleave; a log that cannot be written
costs a warning (once per job directory), never a checkpoint."""

import datetime
import json
import os
import time
from pathlib import Path

from ckpt import paths

EVENTS_NAME = "events.jsonl"
EVENTS_VERSION = 1
KINDS = ("checkpoint", "checkpoint_failed", "restart", "restart_failed", "host_lost",
         "lazy_restore_done")

_warned = set()  # job directories whose log could not be written


def events_path(job_dir):
    return Path(job_dir) / EVENTS_NAME


def iso_time(seconds):
    """An instant as RFC 3339 in UTC, to the millisecond."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text):
    """Seconds since the epoch of an iso_time() string."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def record(job_dir, kind, fields, warn, when=None):
    """Append one event; returns it.  warn(message) is told, once per job
    directory, if the log cannot be written."""
    event = {"v": EVENTS_VERSION, "time": iso_time(when if when is not None else _now()),
             "kind": kind, **fields}
    line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
    path = events_path(job_dir)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            written = os.write(fd, line)
        finally:
            os.close(fd)
        if written != len(line):
            raise OSError(0, f"short write ({written} of {len(line)} bytes)")
    except OSError as exc:
        if str(job_dir) not in _warned:
            _warned.add(str(job_dir))
            warn(f"cannot write the event log {path}: {exc.strerror or exc}")
    return event


def _now():
    return time.time()


class Log(list):
    """The events of a log, oldest first (a list), with what was skipped:
    `malformed` lines (not a JSON object with a kind: a line cut short by a
    full disk, a stray edit) and lines of `other_versions`."""

    def __init__(self, events=(), malformed=0, other_versions=0, lines=0):
        super().__init__(events)
        self.malformed = malformed
        self.other_versions = other_versions
        self.lines = lines  # the log's non-empty lines


def _parse(line):
    """(event, None) or (None, "malformed" | "other_version") or (None, None) for an empty line."""
    line = line.strip()
    if not line:
        return None, None
    try:
        event = json.loads(line)
    except ValueError:
        return None, "malformed"
    if not isinstance(event, dict) or not isinstance(event.get("kind"), str) \
            or "v" not in event:
        return None, "malformed"
    if event["v"] != EVENTS_VERSION:
        return None, "other_version"
    return event, None


def read_log(job_dir, warn=None):
    """The whole log as a Log.  warn(message), if given, is told once how
    many malformed lines were skipped.  A missing log is an empty Log;
    OSError if it cannot be read."""
    with open(events_path(job_dir), "rb") as log:
        text = log.read().decode("utf-8", "replace")
    found, skipped = [], {"malformed": 0, "other_version": 0}
    lines = 0
    for line in text.splitlines():
        event, why = _parse(line)
        lines += bool(line.strip())
        if event is not None:
            found.append(event)
        elif why:
            skipped[why] += 1
    result = Log(found, skipped["malformed"], skipped["other_version"], lines)
    if warn is not None and result.malformed:
        warn(f"{events_path(job_dir)}: skipped {result.malformed} malformed "
             f"line{'s' if result.malformed != 1 else ''}")
    return result


def read(job_dir, warn=None):
    """Every event of the log, oldest first (a Log); lines that do not
    parse and other versions' are skipped (warn is told how many did not
    parse).  No log, or one that cannot be read: empty."""
    try:
        return read_log(job_dir, warn)
    except FileNotFoundError:
        return Log()
    except OSError as exc:
        if warn is not None:
            warn(f"cannot read the event log {events_path(job_dir)}: {exc.strerror or exc}")
        return Log()


BACKWARD_BLOCK = 64 * 1024


def lines_backwards(path, block=BACKWARD_BLOCK):
    """The lines of a file, newest first, read from its end a block at a
    time: the last events of a long log cost what they are, not the log."""
    with open(path, "rb") as log:
        position = log.seek(0, os.SEEK_END)
        partial = b""
        while position > 0:
            step = min(block, position)
            position -= step
            log.seek(position)
            chunk = log.read(step) + partial
            pieces = chunk.split(b"\n")
            partial = pieces[0]  # may go on in the block before
            for piece in reversed(pieces[1:]):
                yield piece.decode("utf-8", "replace")
        yield partial.decode("utf-8", "replace")


def last(job_dir, kinds):
    """The newest event of one of kinds, or None; the log is read from its
    end, only as far back as that event (malformed lines skipped)."""
    try:
        for line in lines_backwards(events_path(job_dir)):
            event, _ = _parse(line)
            if event is not None and event.get("kind") in kinds:
                return event
    except OSError:
        return None
    return None


def _seconds(ns):
    return round(ns / 1e9, 6)


def checkpoint_fields(manifest, path, phases=None, kill=False):
    """A checkpoint event's fields from its published manifest (what every
    process reported: write, flush and stopped times, bytes) and the
    coordinator's own phase times, {phase: seconds}."""
    procs = manifest["processes"]
    # [processes, bytes, longest write, longest stop, longest flush or None]
    # per host, in ns, rounded once per host: this runs at every checkpoint,
    # once per process of the job
    totals = {}
    slowest, slowest_ns = procs[0], -1
    for proc in procs:
        total = totals.get(proc["host"])
        if total is None:
            total = totals[proc["host"]] = [0, 0, 0, 0, None]
        total[0] += 1
        total[1] += int(proc.get("size", 0))
        write_ns = int(proc.get("write_ns", 0))
        stopped_ns = int(proc.get("stopped_ns", 0))
        if write_ns > total[2]:
            total[2] = write_ns
        if stopped_ns > total[3]:
            total[3] = stopped_ns
            if stopped_ns > slowest_ns:
                slowest, slowest_ns = proc, stopped_ns
        if "flush_ns" in proc:
            total[4] = max(total[4] or 0, int(proc["flush_ns"]))
    hosts = {}
    for name, (count, size, write_ns, stopped_ns, flush_ns) in totals.items():
        host = hosts[name] = {"processes": count, "bytes": size, "write_s": _seconds(write_ns),
                              "stopped_s": _seconds(stopped_ns)}
        if flush_ns is not None:
            host["flush_s"] = _seconds(flush_ns)
    fields = {
        "job_id": manifest["job_id"],
        "checkpoint": manifest["checkpoint"],
        "path": str(path),
        "start": iso_time(manifest["start_ns"] / 1e9),
        "duration_s": _seconds(manifest["end_ns"] - manifest["start_ns"]),
        "bytes": sum(host["bytes"] for host in hosts.values()),
        "processes": len(procs),
        "incremental": manifest.get("parent") is not None,
        "kill": kill,  # the job was ended once it was taken (`ckpt checkpoint --kill`)
        "staged": manifest.get("stage_dir") is not None,
        "stopped_max_s": _seconds(max(slowest_ns, 0)),
        "stopped_max_process": {"host": slowest["host"], "pid": slowest["pid"]},
        "phases": {phase: round(seconds, 6) for phase, seconds in (phases or {}).items()},
        "hosts": hosts,
        "warnings": list(manifest.get("warnings") or []),
    }
    return fields


def checkpoint_taken(job_dir, manifest, path, phases, warn, kill=False):
    return record(job_dir, "checkpoint", checkpoint_fields(manifest, path, phases, kill), warn,
                  when=manifest["end_ns"] / 1e9)


def checkpoint_failed(job_dir, job_id, number, start, phases, error, warnings, warn):
    return record(job_dir, "checkpoint_failed", {
        "job_id": job_id, "checkpoint": number,
        "path": str(paths.checkpoint_dir(job_dir, number)),
        "start": iso_time(start), "duration_s": round(_now() - start, 6),
        "phases": {phase: round(seconds, 6) for phase, seconds in phases.items()},
        "error": error, "warnings": list(warnings)}, warn)


def lazy_done_fields(manifest, bytes_in, seconds):
    """A lazy restart's last page is in: bytes the page server brought in
    after the processes resumed, and how long from their resuming."""
    return {"job_id": manifest["job_id"], "checkpoint": manifest["checkpoint"],
            "bytes": bytes_in, "duration_s": round(seconds, 6)}


def restart_fields(manifest, path, start, mapping):
    """What a restart event says beside its outcome: the checkpoint it read,
    how many bytes of images, and where each of its hosts went."""
    return {
        "job_id": manifest["job_id"],
        "checkpoint": manifest["checkpoint"],
        "path": str(path),
        "start": iso_time(start),
        "duration_s": round(_now() - start, 6),
        "bytes": sum(int(p.get("size", 0)) for p in manifest["processes"]),
        "processes": len(manifest["processes"]),
        "hosts": dict(mapping),  # the checkpoint's host -> where it was restored
    }
