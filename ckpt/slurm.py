"""`ckpt slurm run`: the last command of a Slurm batch script.

The job id is the Slurm job id.  The first run launches the command; a
requeued run (SLURM_RESTART_COUNT > 0) with a checkpoint of this job
restarts from the latest one on the new allocation's nodes.  SIGUSR1
(`#SBATCH --signal=B:USR1@SECONDS`, `scancel --signal=USR1 --batch`)
checkpoints, ends the job and requeues it, so the allocation is given
back.  SIGTERM (scancel, a preemption, the time limit) reaches every
process of the job at once: a checkpoint then would catch a job already
dying, so there is none; periodic checkpoints stop and the job ends (Slurm
decides whether it comes back, and a requeued run restarts from the
latest periodic checkpoint).  When the job failed because a node was lost,
Slurm marks the node down and requeues the job (NODE_FAIL); the batch
script waits for that, bounded, then requeues the job itself."""

import asyncio
import os
import re
import signal
import subprocess
import sys
import time

from ckpt import paths, progress
from ckpt.job_status import human_size
from ckpt.errors import CkptError
from ckpt.jobs import forget_job, this_host
from ckpt.manifest import read_manifest, resolve_checkpoint


def slurm_job_id(environ=None):
    environ = os.environ if environ is None else environ
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        raise CkptError("ckpt slurm run: not inside a Slurm job (no SLURM_JOB_ID); "
                        "run it as the last command of an sbatch script", exit_code=2)
    return job_id


def restart_count(environ=None):
    environ = os.environ if environ is None else environ
    try:
        return int(environ.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def nodelist_of(environ):
    """The allocation's nodes as Slurm writes them (`h[1-4]`)."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise CkptError("SLURM_JOB_NODELIST is not set: not the environment of a Slurm "
                        "allocation", exit_code=2)
    return nodelist


def allocation_nodes(environ=None):
    """The allocation's node names, one by one."""
    environ = os.environ if environ is None else environ
    return _scontrol("show", "hostnames", nodelist_of(environ), env=environ).split()


def allocation_hosts(environ=None):
    """The allocation's nodes, this one first (the checkpoint's first host,
    the coordinator's, is restored where the batch script runs)."""
    hosts = allocation_nodes(environ)
    here = this_host()
    return [here] + [h for h in hosts if h != here] if here in hosts else hosts


def _scontrol(*args, killed_ok=False, env=None):
    """scontrol's output.  killed_ok: its end by SIGTERM is success (the
    requeue of our own job ends the batch step, scontrol with it).  env:
    its environment (default: ours)."""
    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60,
                              env=env)
    except FileNotFoundError:
        raise CkptError("scontrol not found: ckpt needs Slurm's commands on PATH under Slurm")
    except subprocess.TimeoutExpired:
        raise CkptError(f"scontrol {' '.join(args)}: no answer in 60 s")
    if done.returncode and not (killed_ok and done.returncode == -signal.SIGTERM):
        lines = done.stderr.strip().splitlines() or [f"status {done.returncode}"]
        raise CkptError(f"scontrol {' '.join(args)}: {lines[-1]}")
    return done.stdout


NODE_FAIL_MARGIN = 60   # seconds past SlurmdTimeout before requeueing ourselves


def slurmd_timeout():
    """SlurmdTimeout in seconds: how long Slurm takes to call a node down."""
    try:
        match = re.search(r"^SlurmdTimeout\s*=\s*(\d+)", _scontrol("show", "config"), re.M)
    except CkptError:
        match = None
    return int(match.group(1)) if match else 300


def wait_for_node_failure(job_id, hosts):
    """The job failed because hosts were lost: Slurm will find them down,
    end this job (NODE_FAIL) and requeue it; if it does not, requeue."""
    bound = slurmd_timeout() + NODE_FAIL_MARGIN
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)   # nothing left to checkpoint
    _say(f"job {job_id}: lost host {', '.join(hosts)}; waiting up to {bound} s for Slurm "
         "to find it down and requeue the job")
    time.sleep(bound)
    _say(f"job {job_id}: Slurm did not requeue the job: requeueing it")
    _scontrol("requeue", job_id, killed_ok=True)


def latest_checkpoint(job_dir):
    """The job's latest published checkpoint, or None."""
    if not job_dir.is_dir():
        return None
    try:
        return resolve_checkpoint(job_dir)
    except CkptError:
        return None


class SlurmSignals:
    """USR1 and TERM, as the batch script of a job under ckpt gets them."""

    def __init__(self, job_id):
        self.job_id = job_id
        self.job = None
        self.leaving = None      # the task that checkpoints and ends the job
        self.requeued = False
        self.early = []          # signals that came before the session ran
        for signum in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(signum, lambda n, _frame: self.early.append(n))

    def attach(self, job):
        """Called once the job's session runs (launch or restart)."""
        self.job = job
        job.outlive_command = False   # Slurm ends whatever outlives the batch script
        job.loop.add_signal_handler(signal.SIGUSR1, self._on_signal, signal.SIGUSR1)
        job.loop.add_signal_handler(signal.SIGTERM, self._on_signal, signal.SIGTERM)
        job.finishing.append(self._finished)
        for signum in self.early:
            job.loop.call_soon(self._on_signal, signum)

    def _on_signal(self, signum):
        if self.leaving is not None:
            return
        if signum == signal.SIGUSR1:
            self.leaving = asyncio.ensure_future(self._checkpoint_and_requeue())
        else:
            _say(f"job {self.job_id}: TERM: the job ends (its latest checkpoint stays)")
            self.job.stop_periodic()
            self.job.coordinator.kill()
            self.leaving = asyncio.ensure_future(asyncio.sleep(0))

    async def _checkpoint_and_requeue(self):
        _say(f"job {self.job_id}: USR1: checkpoint and requeue")
        self.job.stop_periodic()
        coordinator = self.job.coordinator
        # its progress in the job's log, a line at each phase
        watching = asyncio.ensure_future(progress.log_checkpoint(
            coordinator.status, coordinator.job_dir, lambda line: _say(f"job {self.job_id}: {line}")))
        started = time.monotonic()
        try:
            path, _ = await coordinator.checkpoint(kill=True)
            written = sum(progress.bytes_by_host(path, self._hosts(path)).values())
            _say(f"job {self.job_id}: checkpoint {path} ({human_size(written)} in "
                 f"{time.monotonic() - started:.1f} s)")
        except CkptError as exc:
            _say(f"job {self.job_id}: the checkpoint failed ({exc.message}); "
                 "the previous checkpoint stays")
            coordinator.kill()
        finally:
            watching.cancel()
        await asyncio.get_running_loop().run_in_executor(None, self._requeue)

    @staticmethod
    def _hosts(path):
        try:
            return sorted({p["host"] for p in read_manifest(path)["processes"]})
        except (CkptError, OSError, KeyError, TypeError):
            return []

    def _requeue(self):
        try:
            _scontrol("requeue", self.job_id, killed_ok=True)
            self.requeued = True
            _say(f"job {self.job_id}: requeued")
        except CkptError as exc:
            _say(f"job {self.job_id}: cannot requeue: {exc.message}")

    async def _finished(self):
        if self.leaving is not None:
            await self.leaving


def _say(message):
    print(f"ckpt: {message}", file=sys.stderr, flush=True)


def run(command, config):
    """Launch or restart this Slurm job; returns the batch script's status."""
    from ckpt.launch import launch
    from ckpt.restart import restart

    job_id = slurm_job_id()
    signals = SlurmSignals(job_id)
    job_dir = paths.job_dir(config.ckpt_dir, job_id)
    restarts = restart_count()
    if restarts > 0:
        forget_job(job_id)   # the run before this one is over, even if its host died
    latest = latest_checkpoint(job_dir) if restarts > 0 else None
    if latest is not None:
        taken_of = read_manifest(latest).get("command") or []
        if list(taken_of) != list(command):
            raise CkptError(f"{latest} is a checkpoint of another command "
                            f"({' '.join(taken_of)}); not restarting it as this job",
                            exit_code=2)
        _say(f"job {job_id}: requeued run {restarts}: restarting from {latest}")
        # other nodes' ckpt-restart start as config.launcher says: srun,
        # inside the allocation, unless the user chose ssh
        status = restart(latest, lambda _ckpt_dir: config, allocation_hosts(),
                         on_session=signals.attach)
    else:
        status = launch(command, config, job_id, on_session=signals.attach)
    if signals.requeued:
        return 0
    lost = sorted(signals.job.coordinator.lost_hosts) if signals.job else []
    if status and lost and signals.leaving is None:
        wait_for_node_failure(job_id, lost)
        return 0
    return status
