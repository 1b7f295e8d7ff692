"""Progress of `ckpt checkpoint` and `ckpt restart` on a terminal (rich):
the phase under way, bytes so far out of the expected total, rate, time
left, a line per host when the job has several.  Nothing at all when
stderr is not a terminal.

What it can see: a checkpoint's phase comes from the coordinator
(`STATUS`), its bytes from the images growing in the checkpoint's
directory (a staged checkpoint's once they are copied there), its total
from the job's previous checkpoint (the first one has none: bytes and
rate only).  A restart's phase and how many of each host's processes are
back come from its own coordinator; the bytes each ckpt-restart has read
are not visible, so a restart shows the images' size, not a byte count."""

import asyncio
import collections
import contextlib
import os
import sys
import threading

from ckpt import events
from ckpt.errors import CkptError
from ckpt.job_status import human_size

POLL_SECONDS = 0.25
STATUS_SECONDS = 1.0

# what each phase does, in the words a user watching it needs
PHASE_WORDS = {
    None: "starting",
    "STOP": "stopping the job", "RELEASE": "stopping the job", "SUSPEND": "stopping the job",
    "DRAIN": "draining connections", "FLUSH": "draining connections",
    "WRITE": "writing images", "FINGERPRINT": "fingerprinting",
    "RESUME": "resuming the job", "SYNC": "writing images (job running)",
    "PUBLISH": "publishing", "TERMINATE": "ending the job",
    "REBUILD": "rebuilding connections", "REFILL": "refilling connections",
}


def wanted(stream=None):
    """Progress only for a person at a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        if not stream.isatty() or os.environ.get("TERM") == "dumb":
            return False
    except (AttributeError, ValueError):
        return False
    try:  # setup.sh installs it; a checkpoint never fails for want of bars
        import rich.progress  # noqa: F401
    except ImportError:
        return False
    return True


def _bar(transfer):
    """A rich Progress on stderr: bytes and rate (transfer) or a count."""
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress,
                               TextColumn, TimeElapsedColumn, TimeRemainingColumn,
                               TransferSpeedColumn)
    columns = [TextColumn("{task.description}"), BarColumn()]
    if transfer:
        columns += [DownloadColumn(binary_units=True), TransferSpeedColumn(), TimeRemainingColumn()]
    else:
        columns += [MofNCompleteColumn()]
    columns += [TimeElapsedColumn()]
    return Progress(*columns, console=Console(stderr=True), transient=True,
                    refresh_per_second=8)


def _phase_words(progress):
    phase = progress.get("phase")
    words = PHASE_WORDS.get(phase, phase.lower() if phase else "starting")
    if phase == "SYNC" and progress.get("staged"):
        words = "copying staged images (job running)"
    return words


def bytes_by_host(directory, hosts):
    """{host: bytes} of the images in a checkpoint's directory so far
    (an image is <host>-<pid>.img, with its .pages and .sum)."""
    sizes = {host: 0 for host in hosts}
    # the longest name first: a host may be another's prefix (node1, node1-ib)
    ordered = sorted(hosts, key=len, reverse=True)
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return sizes
    for entry in entries:
        host = next((h for h in ordered if entry.name.startswith(h + "-")), None)
        if host is None:
            continue
        try:
            sizes[host] += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return sizes


def expected_bytes(job_dir):
    """{host: bytes} of the job's previous checkpoint, the estimate of this
    one's; {} when there is none."""
    last = events.last(job_dir, ("checkpoint",))
    if last is None:
        return {}
    return {host: facts.get("bytes", 0) for host, facts in (last.get("hosts") or {}).items()}


class CheckpointProgress:
    """Redraws the bars from the coordinator's status and the directory."""

    def __init__(self, bar, job_dir):
        self.bar = bar
        self.expected = expected_bytes(job_dir)
        self.total_task = None
        self.host_tasks = {}

    def update(self, status):
        progress = status.get("checkpoint")
        if not progress:
            return
        hosts = sorted({p["host"] for p in status.get("processes", ())}) or list(self.expected)
        done = bytes_by_host(progress["directory"], hosts)
        name = f"ckpt-{progress['number']:04d}"
        total = sum(self.expected.values()) or None
        description = f"{name} {_phase_words(progress)}"
        if self.total_task is None:
            self.total_task = self.bar.add_task(description, total=total)
        self.bar.update(self.total_task, description=description,
                        completed=sum(done.values()),
                        total=max(total, sum(done.values())) if total else None)
        if len(hosts) < 2:
            return
        for host in hosts:
            expected = self.expected.get(host) or None
            if host not in self.host_tasks:
                self.host_tasks[host] = self.bar.add_task(f"  {host}", total=expected)
            self.bar.update(self.host_tasks[host], completed=done[host],
                            total=max(expected, done[host]) if expected else None)


def checkpoint(job, request, status):
    """request() with progress while it runs: request is the blocking
    checkpoint request, status() the job's status (a second connection)."""
    if not wanted():
        return request()
    outcome = {}

    def take():
        try:
            outcome["value"] = request()
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc
    worker = threading.Thread(target=take, daemon=True)
    worker.start()
    with _bar(transfer=True) as bar:
        view = CheckpointProgress(bar, job.job_dir)
        while worker.is_alive():
            try:
                view.update(status())
            except (CkptError, OSError, ValueError, KeyError):
                pass  # the bars wait for the next look
            bar.refresh()
            # the status lists every process: asked once a second, so that
            # watching a big job's checkpoint does not slow it
            worker.join(STATUS_SECONDS)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@contextlib.contextmanager
def restart_progress(coordinator, manifest, mapping):
    """While a restart restores: its phase and, per host, how many of the
    checkpoint's processes are back (connected to the new coordinator)."""
    if not wanted():
        yield
        return
    expected = {}
    for proc in manifest["processes"]:
        new_host = mapping.get(proc["host"], proc["host"])
        expected[new_host] = expected.get(new_host, 0) + 1
    size = sum(int(p.get("size", 0)) for p in manifest["processes"])
    name = f"ckpt-{manifest['checkpoint']:04d}"
    with _bar(transfer=False) as bar:
        total_task = bar.add_task(name, total=len(manifest["processes"]))
        host_tasks = {host: bar.add_task(f"  {host}", total=count)
                      for host, count in expected.items()} if len(expected) > 1 else {}

        def redraw():
            back = [p for p in coordinator.live_processes() if p.restored]
            phase = getattr(coordinator, "phase", None)
            words = PHASE_WORDS.get(phase, "") if phase else "restoring images"
            bar.update(total_task, completed=len(back),
                       description=f"{name} {words} ({human_size(size)})")
            if host_tasks:
                per_host = collections.Counter(p.host for p in back)   # one pass
                for host, task in host_tasks.items():
                    bar.update(task, completed=per_host[host])
            bar.refresh()

        async def redraw_often():
            while True:
                redraw()
                await asyncio.sleep(POLL_SECONDS)
        task = asyncio.ensure_future(redraw_often())
        try:
            yield
        finally:
            task.cancel()


# ---- lines for a log (`ckpt slurm run`'s checkpoint at USR1) -------------------

LOG_POLL_SECONDS = 0.5   # how often the checkpoint is looked at
LOG_EVERY_SECONDS = 10   # a line at each phase, and while bytes grow at most this often


def checkpoint_line(progress, done, expected):
    """One line of a checkpoint's progress: its phase, the bytes of its
    images so far (of the previous checkpoint's, the estimate), per host
    when there are several."""
    name = f"ckpt-{progress['number']:04d}"
    written = sum(done.values())
    total = sum(expected.values())
    line = f"{name} {_phase_words(progress)}: {human_size(written)}"
    if total:
        line += f" of ~{human_size(max(total, written))}"
    if len(done) > 1:
        line += " (" + ", ".join(f"{host} {human_size(size)}"
                                 for host, size in sorted(done.items())) + ")"
    return line


async def log_checkpoint(status, job_dir, say, poll=LOG_POLL_SECONDS, every=LOG_EVERY_SECONDS):
    """Says a line (say(text)) at each phase of the checkpoint under way and,
    while its images grow, one every `every` seconds: for a log, where bars
    would be noise.  status() is the coordinator's; runs until cancelled."""
    import time
    expected = expected_bytes(job_dir)
    said, said_at, said_bytes = None, 0.0, None
    while True:
        try:
            current = status()
            progress = current.get("checkpoint")
            if progress:
                hosts = sorted({p["host"] for p in current.get("processes", ())}) or \
                    list(expected)
                done = bytes_by_host(progress["directory"], hosts)
                phase = (progress["number"], _phase_words(progress))
                now = time.monotonic()
                if phase != said or (sum(done.values()) != said_bytes and now - said_at >= every):
                    say(checkpoint_line(progress, done, expected))
                    said, said_at, said_bytes = phase, now, sum(done.values())
        except (CkptError, OSError, ValueError, KeyError):
            pass  # the next look
        await asyncio.sleep(poll)
