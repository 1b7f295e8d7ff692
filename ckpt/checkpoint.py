"""One checkpoint of a job: SUSPEND, DRAIN, FLUSH, WRITE, RESUME as barriers, then
the manifest and the atomic publication of <job-dir>/ckpt-NNNN."""

import asyncio
import contextlib
import errno
import fcntl
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from ckpt import events
from ckpt import image_check
from ckpt import manifest as manifests
from ckpt import paths
from ckpt import stopped as stopped_processes
from ckpt import verify
from ckpt.barrier import PhaseError
from ckpt.errors import CkptError
from ckpt.wire import escape

SUSPENDING_PHASES = ("STOP", "RELEASE", "SUSPEND")  # a process may still exit by itself
ABORT_TIMEOUT = 10.0  # how long suspended processes get to acknowledge an abort
CHILD_HELLO_WAIT = 0.5  # a child forked just before SUSPEND: its HELLO is on its way
NEWCOMER_ROUNDS = 20  # newcomers' own children, forked before they were parked


def prepare_directory(job_dir):
    """Create <job-dir>/.ckpt-NNNN.tmp before any process is suspended, so an
    unwritable or full checkpoint directory never stops the job."""
    try:
        job_dir.mkdir(parents=True, exist_ok=True)
        if os.statvfs(job_dir).f_bavail == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        number = manifests.next_number(job_dir)
        tmp = paths.tmp_dir(job_dir, number)
        tmp.mkdir()
    except OSError as exc:
        raise CkptError(f"cannot write checkpoint directory {job_dir}: {exc.strerror}")
    return number, tmp


def _locked(path):
    """Whether a process holds a flock on path (it exists and is locked)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _pids(text):
    """The pids of a comma-separated list; what is not a number is ignored."""
    return [int(pid) for pid in text.split(",") if pid.isdigit()]


@dataclass(frozen=True)
class CheckpointedJob:
    """The job a checkpoint is of, as its directory and manifest name it."""
    job_id: str
    job_dir: Path
    command: list
    restarted_from: int = None   # the checkpoint the job was restarted from


class CheckpointRun:
    """Takes one checkpoint of a job: its barriers over the job's processes,
    the name-service keys it sets, the warnings it collects."""

    def __init__(self, job, procs, mode, kill=False, *, barrier, pause_before,
                 live_processes, joins, wait_for_ids, names, note, warn, warnings, host_addresses,
                 barrier_timeout, fingerprint):
        """job: a CheckpointedJob; procs: its processes registered now;
        mode: a WriteMode; kill: the job is killed once it is taken.
        What the coordinator lends it: barrier(phase, procs, arg, timeout=,
        seq=) -> (answers, gone) and pause_before(phase, procs) over the
        processes; live_processes(), joins() (how many processes ever
        joined) and wait_for_ids(ids, seconds) of its registry; names, its
        NameService; note(message) for stderr and `warnings`, the list
        this checkpoint's manifest and reply carry; warn(message) for
        stderr only; host_addresses() for the manifest;
        barrier_timeout, how long a forked writer's result is waited for;
        fingerprint(procs, directory), the processes' fingerprints taken
        while they are parked (ckpt/verify.py)."""
        self.job = job
        self.procs = list(procs)
        self.kill = kill
        self.mode = mode.before_kill() if kill else mode
        self.phases = {}       # phase -> seconds its barriers took, for the event log
        self.phase = None      # the phase under way (`ckpt status`, progress)
        self.phase_started = None
        self.barrier = self._timed(barrier)
        self.pause_before = pause_before
        self.live_processes = live_processes
        # processes that ever joined: unchanged, none can have joined since
        # procs were taken (no list of the whole job to look through)
        self.joins, self.joins_at_start = joins, joins()
        self.wait_for_ids = wait_for_ids
        self.names = names
        self.note = note
        self.warn = warn
        self.warnings = warnings
        self.host_addresses = host_addresses
        self.barrier_timeout = barrier_timeout
        self.fingerprint = fingerprint
        self.number, self.tmp = prepare_directory(job.job_dir)
        # node-local first, copied to the checkpoint directory while the job runs on
        self.staged = None if not self.mode.stage_dir else \
            paths.staged_dir(self.mode.stage_dir, job.job_id, self.number)
        # incremental: the checkpoint this one is taken against (None: full)
        self.parent, _chain = manifests.incremental_parent(job.job_dir, self.mode.full_every)
        self.start_ns = time.time_ns()

    def _timed(self, barrier):
        """barrier, noting which phase runs and adding up how long each took."""
        async def timed(phase, procs, arg=None, **options):
            with self._timing(phase):
                return await barrier(phase, procs, arg, **options)
        return timed

    @contextlib.contextmanager
    def _timing(self, phase):
        self.phase, self.phase_started = phase, time.time()
        try:
            yield
        finally:
            self.phases[phase] = self.phases.get(phase, 0.0) + time.time() - self.phase_started

    def progress(self):
        """Where this checkpoint is, for `ckpt status` and the CLI's progress."""
        return {"number": self.number, "start": self.start_ns / 1e9, "phase": self.phase,
                "phase_start": self.phase_started, "directory": str(self.tmp),
                "staged": self.staged is not None, "kill": self.kill,
                "processes": len(self.procs)}

    async def run(self):
        """Returns the published directory; CkptError (job resumed) on
        failure.  Either way a line goes to the job's event log."""
        try:
            final = await self._run()
        except CkptError as exc:
            events.checkpoint_failed(self.job.job_dir, self.job.job_id, self.number,
                                     self.start_ns / 1e9, self.phases, exc.message,
                                     self.warnings, self.warn)
            raise
        events.checkpoint_taken(self.job.job_dir, self.manifest, final, self.phases,
                                self.warn, kill=self.kill)
        return final

    async def _run(self):
        # RESUME abort reaches them all on failure (newcomers join the list)
        self.to_abort = list(self.procs)
        self.thawed = []
        self.names.forget_checkpoint(self.number)
        try:
            held = await stopped_processes.find(self.procs)
        except PhaseError as exc:
            manifests.discard(self.tmp)
            raise CkptError(f"checkpoint {self.number} of job {self.job.job_id} failed: {exc}")
        try:
            held_set = set(held)  # membership tests over the whole job: sets, not lists
            threads = await self._suspend([p for p in self.procs if p not in held_set])
            if held:
                threads.update(await self._suspend_stopped(held))
            threads.update(await self._take_in_newcomers(threads))
            await self._phase("DRAIN")
            # bytes a TCP sender holds reach their receiver: the marker
            # tells where its peer stopped writing
            await self._phase("FLUSH", secrets.token_hex(16))
            written = await self._phase(
                "WRITE", escape(self.tmp) + self.mode.write_words(self.staged, self.parent))
            with self._timing("FINGERPRINT"):
                await self.fingerprint(self.procs, self.tmp)  # still parked: what the kernel shows
            # written in place and unstaged: complete once WRITE is done
            images_done = not self.mode.forked and not self.staged
            if images_done:
                entries = self._image_entries(written, threads)
            # the stopped ones' threads stop again before RESUME could wake them
            await stopped_processes.freeze_app(self.thawed)
            stopped = {}
            if not self.kill:  # --kill: the job dies suspended, never resumed
                self.to_abort = []  # RESUME ok is out: no abort after this point
                # a process that exits once resumed still has a complete image
                stopped, _ = await self.barrier("RESUME", self.procs, "ok", seq=self.number)
            if not images_done:
                # the children write (or copy staged images) while the job
                # runs; a process that wrote in place, unstaged, answered
                # WRITE with the file keys
                synced = await self._sync(written)
                entries = self._image_entries(
                    {p: {**written.get(p, {}), **synced[p]} for p in self.procs}, threads)
            if self.joins() != self.joins_at_start:
                taken_part = set(self.procs)
                for proc in self.live_processes():
                    if proc not in taken_part:
                        self.note(f"{proc.describe()} started during the checkpoint and is not part of it")
            with self._timing("PUBLISH"):
                await self.pause_before("PUBLISH", self.procs)
                return self._publish(entries, stopped)
        except (PhaseError, OSError) as exc:
            await self._abandon(self.to_abort)
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise CkptError(f"checkpoint {self.number} of job {self.job.job_id} failed: {reason}")
        except BaseException:
            await self._abandon(self.to_abort)
            raise
        finally:
            await stopped_processes.freeze(self.thawed)

    async def _phase(self, phase, arg=None, procs=None):
        """A barrier (of procs, default all).  A process that exited on its
        way to being suspended is left out with a warning; one that dies
        once suspended (killed: it cannot exit by itself, its host gone)
        changed the job under the checkpoint, which is abandoned."""
        answers, gone = await self.barrier(
            phase, self.procs if procs is None else procs, arg, seq=self.number)
        if gone and phase not in SUSPENDING_PHASES:
            raise PhaseError(f"{gone[0].describe()} died while suspended, during {phase}")
        for proc in gone:
            self.note(f"{proc.describe()} exited during the checkpoint; it is left out")
        if gone:
            left_out = set(gone)
            self.procs = [p for p in self.procs if p not in left_out]
        if not self.procs:
            raise PhaseError("every process of the job exited during the checkpoint")
        return answers

    async def _suspend(self, group):
        """STOP, RELEASE (plugins with hardware that cannot be imaged let go
        of it while the application still runs: docs/PROTOCOL.md), SUSPEND."""
        if not group:
            return {}
        checked = None
        for phase in SUSPENDING_PHASES:
            if self.procs is not checked:
                # those of group still in the checkpoint, again only once
                # one left (a set: a list made it quadratic in the job's
                # size, issue 33)
                still = set(self.procs)
                group = [p for p in group if p in still]
                checked = self.procs
            answers = await self._phase(phase, procs=group)
        return answers

    async def _suspend_stopped(self, held):
        """Stopped processes take part through a tracer and stay stopped.
        They are thawed only once the others are parked: a thread the
        tracer takes or lets go shows as running for a moment, which a
        parent that still ran could see."""
        held_set = set(held)
        self.to_abort = [p for p in self.to_abort if p not in held_set]
        self.thawed = await stopped_processes.thaw(held)
        for proc in (proc for t in self.thawed for proc in t.procs):
            self.names.put(f"stopped:{self.number}:{proc.host}:{proc.pid}", "1")
        self.to_abort.extend(held)  # thawed, or running again since
        return await self._suspend(held)

    async def _sync(self, written):
        """SYNC: the forked writers' results.  A process gone since RESUME
        (it exited, execed or was killed) left its writer running, which
        leaves the result next to the image."""
        answers, gone = await self.barrier("SYNC", self.procs, seq=self.number)
        for proc in gone:
            keys = await self._result_left(written.get(proc, {}))
            if keys is None:
                self.note(f"{proc.describe()} exited during the checkpoint; it is left out")
            else:
                # its writer's answer came by file, not through its host's check
                image_check.check(self.tmp, {proc: keys}, lambda proc: proc.describe())
                answers[proc] = keys
        self.procs = [p for p in self.procs if p in answers]
        if not self.procs:
            raise PhaseError("every process of the job exited during the checkpoint")
        return answers

    async def _result_left(self, write_keys):
        """The DONE keys its writer left in <image>.done; None if the writer
        died first (the lock it holds on <image>.done.tmp is free)."""
        if "forked" not in write_keys and "flushing" not in write_keys:
            return {}  # written in place: complete already
        done = self.tmp / f"{write_keys.get('file', '')}.done"
        deadline = time.monotonic() + self.barrier_timeout
        while time.monotonic() < deadline:
            writer_gone = not _locked(done.with_name(done.name + ".tmp"))
            try:
                text = done.read_text()
            except OSError:
                if writer_gone:
                    return None
                await asyncio.sleep(0.02)
                continue
            return dict(word.split("=", 1) for word in text.split() if "=" in word)
        return None

    async def _take_in_newcomers(self, suspended):
        """Every process is parked now, but some joined after the barriers
        began (a child forked during STOP), or forked a child just before
        parking whose HELLO is still on its way; their parents' images count
        on them.  They go through STOP, RELEASE and SUSPEND on their own,
        then join the rest: returns their SUSPEND answers."""
        taken, answers = {}, suspended
        for _ in range(NEWCOMER_ROUNDS):
            children = {(proc.host, pid) for proc, keys in answers.items()
                        if "children" in keys for pid in _pids(keys["children"])}
            # one that exits before its HELLO is a zombie now: not waited for long
            if not await self.wait_for_ids(children, CHILD_HELLO_WAIT):
                self.note("a child forked just before the checkpoint did not register "
                          "in time (exited, or still in exec?); it may be left out")
            if self.joins() == self.joins_at_start:
                return taken   # nobody joined since the checkpoint began
            known = set(self.procs)
            newcomers = [p for p in self.live_processes() if p not in known]
            if not newcomers:
                return taken
            self.to_abort.extend(newcomers)
            for phase in ("STOP", "RELEASE", "SUSPEND"):
                answers, _gone = await self.barrier(phase, newcomers, seq=self.number)
                newcomers = [p for p in newcomers if p in answers]
            self.procs.extend(newcomers)
            taken.update(answers)
        raise PhaseError("processes kept starting during the checkpoint")

    def _image_entries(self, written, threads):
        """Manifest entries from the DONE WRITE keys.  The images of this
        host's processes are checked against their files here; each other
        host's agent checked its own before it answered (ckpt/image_check.py)."""
        image_check.check(self.tmp, {p: written[p] for p in self.procs if p.agent is None},
                          lambda proc: proc.describe())
        entries = {}
        no_keys = {}
        for proc in self.procs:
            keys = written[proc]
            name = keys.get("file", "")
            if image_check.bad_name(name):
                raise PhaseError(f"{proc.describe()} reported {image_check.bad_name(name)}")
            if "size" not in keys:
                raise PhaseError(f"{proc.describe()} reported no size for image {name}")
            entry = entries[proc] = {
                "pid": proc.pid,
                "host": proc.host,
                "image": name,
                "size": int(keys["size"]),
                "xxh3": keys.get("xxh3", "").lower(),
                "write_ns": int(keys.get("write_ns", 0)),
                # a process may write in place when asked for a forked write
                "written": "forked" if "forked" in keys else "in place",
                "threads": int(threads.get(proc, no_keys).get("threads", 0)),
            }
            if "flush_ns" in keys:  # staged: written there, then copied here
                entry["flush_ns"] = int(keys["flush_ns"])
            if "chain" in keys:  # incremental: what the image holds, what it reads elsewhere
                entry.update(
                    own=int(keys.get("own", 0)), referred=int(keys.get("referred", 0)),
                    chain=int(keys["chain"]),
                    sources=[n for n in keys.get("sources", "").split(",")
                             if paths.CKPT_RE.match(n)])
        return entries

    def _publish(self, entries, stopped):
        images = {entry["image"] for entry in entries.values()}
        # what else is in the directory: images of processes that were left
        # out (set arithmetic: no Python step per image kept)
        for name in set(os.listdir(self.tmp)) - images:
            # an incremental image's page list, every image's block checksums
            stem, _, suffix = name.rpartition(".")
            if (suffix in ("pages", "sum") and stem in images) or verify.kept(name):
                continue
            os.unlink(self.tmp / name)
        processes = []
        for proc, entry in entries.items():
            entry["stopped_ns"] = int(stopped.get(proc, {}).get("stopped_ns", 0))
            processes.append(entry)
        manifest = manifests.build_manifest(
            job_id=self.job.job_id, number=self.number, command=self.job.command,
            processes=processes, start_ns=self.start_ns, end_ns=time.time_ns(),
            restarted_from=self.job.restarted_from, warnings=list(self.warnings),
            addresses=self.host_addresses(),
            parent=paths.checkpoint_number(self.parent) if self.parent else None,
            full_every=self.mode.full_every,
            stage_dir=str(self.mode.stage_dir) if self.staged else None)
        manifests.write_manifest(self.tmp, manifest)
        self.manifest = manifest
        return manifests.publish(self.tmp, paths.checkpoint_dir(self.job.job_dir, self.number))

    async def _abandon(self, suspended):
        """Let suspended processes go on, and forget the half-written checkpoint."""
        await stopped_processes.freeze_app(self.thawed)
        alive = [p for p in suspended if p.alive]
        if alive:
            try:
                await self.barrier("RESUME", alive, "abort", timeout=ABORT_TIMEOUT, seq=self.number)
            except PhaseError as exc:
                self.warn(f"while aborting the checkpoint: {exc}")
        manifests.discard(self.tmp)
