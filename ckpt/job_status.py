"""What `ckpt status` and `ckpt list` say about a running job, as one
object: the registry's entry, the coordinator's answer and the job's
event log together.  `--json` prints these objects as they are (a stable
format, docs/STATUS.md, schema ckpt/schemas/status.json); the text forms
are made from them."""

import datetime
import shlex
import time

from ckpt import client, events
from ckpt.errors import CkptError
from ckpt.manifest import read_manifest, resolve_checkpoint

STATUS_VERSION = 1


def command_line(command):
    """A command as one shell-quoted line (a newline inside a word stays
    quoted, so a job is one line of `ckpt list`)."""
    if not command:
        return "-"
    return shlex.join(command).replace("\n", "\\n")


def _last_checkpoint(job_dir):
    """The newest checkpoint's facts: from the event log, else (a job
    directory from before the log) from the latest manifest."""
    event = events.last(job_dir, ("checkpoint",))
    if event is None:
        try:
            path = resolve_checkpoint(job_dir)
            event = {"time": events.iso_time(path.stat().st_mtime),
                     **events.checkpoint_fields(read_manifest(path), path)}
        except (CkptError, OSError):
            return None
    return {key: event.get(key) for key in (
        "checkpoint", "path", "time", "duration_s", "stopped_max_s", "bytes", "incremental",
        "staged")} | {"warnings": len(event.get("warnings") or ())}


def _last_failure(job_dir):
    event = events.last(job_dir, ("checkpoint", "restart", "checkpoint_failed",
                                  "restart_failed", "host_lost"))
    if event is None or event["kind"] in ("checkpoint", "restart"):
        return None  # a failure before a later success is over
    what = event.get("error") or f"host {event.get('host')} lost"
    return {"kind": event["kind"], "time": event["time"], "error": what}


def describe(job, timeout=5.0, must_answer=False):
    """The status object of a registered job.  If its coordinator does not
    answer: CkptError (must_answer), else reachable: false with what the
    registry and the event log know."""
    try:
        info = client.status(job, timeout=timeout)
        error = None
    except CkptError as exc:
        if must_answer:
            raise
        info, error = {}, exc.message
    processes = [{key: p.get(key) for key in ("pid", "real_pid", "host", "restored")}
                 for p in info.get("processes", ())]
    progress = info.get("checkpoint")
    next_at = info.get("next_checkpoint_at")
    return {
        "job_id": job.job_id,
        "reachable": error is None,
        "error": error,
        "launcher_pid": job.launcher_pid,
        "launcher_host": job.host or None,
        "command": list(job.command),
        "command_line": command_line(job.command),
        "job_dir": job.job_dir,
        "started": events.iso_time(job.started),
        "restarted_from": info.get("restarted_from"),
        "processes": processes,
        "hosts": sorted({p["host"] for p in processes}),
        "checkpoints_taken": info.get("checkpoints_taken"),
        "last_checkpoint": _last_checkpoint(job.job_dir),
        "last_failure": _last_failure(job.job_dir),
        "checkpoint_in_progress": None if not progress else {
            "checkpoint": progress["number"],
            "start": events.iso_time(progress["start"]),
            "phase": progress.get("phase"),
            "staged": bool(progress.get("staged")),
            # a staged checkpoint's images are copied while the job runs on
            "flushing": bool(progress.get("staged")) and progress.get("phase") == "SYNC",
        },
        "interval_s": info.get("interval"),
        "next_checkpoint": events.iso_time(next_at) if next_at else None,
        # a lazy restart (--lazy): bytes of the processes' memory still to
        # come from the images (a first estimate, the images' size, until
        # the page server's first word); null once the last page is in
        "lazy_bytes_left": info.get("lazy_bytes_left"),
    }


def report(statuses):
    """The `--json` document of describe()'s objects."""
    return {"v": STATUS_VERSION, "jobs": list(statuses)}


# ---- text ------------------------------------------------------------------

def local_time(iso):
    return datetime.datetime.fromtimestamp(events.parse_time(iso)).strftime("%Y-%m-%d %H:%M:%S")


def human_size(size):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024


def _seconds(value):
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.1f} s" if value < 100 else f"{value:.0f} s"


def checkpoint_summary(last):
    """`ckpt-0003 at 2026-12-07 14:02:11, 1.2 s, stopped 85 ms, 512.0 MiB`"""
    if not last:
        return "none"
    parts = [f"ckpt-{last['checkpoint']:04d} at {local_time(last['time'])}"]
    if last.get("duration_s") is not None:
        parts.append(f"took {_seconds(last['duration_s'])}")
    if last.get("stopped_max_s"):
        parts.append(f"stopped {_seconds(last['stopped_max_s'])} at most")
    if last.get("bytes") is not None:
        parts.append(human_size(last["bytes"]) + (" incremental" if last.get("incremental") else ""))
    if last.get("warnings"):
        parts.append(f"{last['warnings']} warnings")
    return ", ".join(parts)


def next_summary(status):
    running = status["checkpoint_in_progress"]
    if running:
        now = f"ckpt-{running['checkpoint']:04d} under way ({(running['phase'] or 'starting')}"
        return now + (", flushing staged images)" if running["flushing"] else ")")
    if status["next_checkpoint"]:
        left = events.parse_time(status["next_checkpoint"]) - time.time()
        return f"periodic at {local_time(status['next_checkpoint'])} (in {max(left, 0):.0f} s)"
    return "when asked (no periodic checkpoints)"


def text_lines(status):
    """`ckpt status`'s lines for one job."""
    lines = [f"job {status['job_id']}"]
    if not status["reachable"]:
        lines.append(f"  not answering: {status['error']}")
    lines += [f"  launcher:     pid {status['launcher_pid']}"
              + (f" on {status['launcher_host']}" if status["launcher_host"] else ""),
              f"  command:      {status['command_line']}",
              f"  started:      {local_time(status['started'])}",
              f"  job dir:      {status['job_dir']}"]
    if status["restarted_from"] is not None:
        lines.append(f"  restarted from checkpoint {status['restarted_from']}")
    if status.get("lazy_bytes_left") is not None:
        lines.append(f"  memory to come: {human_size(status['lazy_bytes_left'])} "
                     "(lazy restart: checkpoints wait until it is in)")
    procs = ", ".join(f"{p['pid']}@{p['host']}" for p in status["processes"])
    lines.append(f"  processes:    {procs or 'none registered'}")
    if status["hosts"]:
        lines.append(f"  hosts:        {', '.join(status['hosts'])}")
    if status["checkpoints_taken"] is not None:
        lines.append(f"  checkpoints:  {status['checkpoints_taken']} taken by this run")
    lines.append(f"  last:         {checkpoint_summary(status['last_checkpoint'])}")
    if status["reachable"]:
        lines.append(f"  next:         {next_summary(status)}")
    if status["last_failure"]:
        failure = status["last_failure"]
        lines.append(f"  failed:       {failure['kind']} at {local_time(failure['time'])}: "
                     f"{failure['error']}")
    return lines


def list_line(status):
    """`ckpt list`'s line: id, launcher pid, checkpoints taken, last
    checkpoint, command (last: the one column of any width)."""
    taken = status["checkpoints_taken"]
    last = status["last_checkpoint"]
    last_text = f"ckpt-{last['checkpoint']:04d}@{local_time(last['time'])}" if last else "-"
    return "\t".join([status["job_id"], str(status["launcher_pid"]),
                      "?" if taken is None else str(taken), last_text, status["command_line"]])
