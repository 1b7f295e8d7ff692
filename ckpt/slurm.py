"""`ckpt slurm run`: the last command of a Slurm batch script.

The job id is the Slurm job id.  The first run launches the command; a
requeued run (SLURM_RESTART_COUNT > 0) with a checkpoint of this job
restarts from the latest one on the new allocation's nodes.  SIGUSR1
(`#SBATCH --signal=B:USR1@SECONDS`, `scancel --signal=USR1 --batch`)
checkpoints, ends the job and requeues it, so the allocation is given
back; SIGTERM (scancel, a preemption) checkpoints if the job still runs,
then ends it (Slurm decides whether it comes back)."""

import asyncio
import os
import signal
import subprocess
import sys

from ckpt.errors import CkptError
from ckpt.jobs import this_host
from ckpt.manifest import resolve_checkpoint

TERM_CHECKPOINT_SECONDS = 20   # within Slurm's KillWait, or the periodic one serves


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


def allocation_hosts(environ=None):
    """The allocation's nodes, this one first (the checkpoint's first host,
    the coordinator's, is restored where the batch script runs)."""
    environ = os.environ if environ is None else environ
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise CkptError("ckpt slurm run: SLURM_JOB_NODELIST is not set", exit_code=2)
    hosts = _scontrol("show", "hostnames", nodelist).split()
    here = this_host()
    return [here] + [h for h in hosts if h != here] if here in hosts else hosts


def _scontrol(*args, killed_ok=False):
    """scontrol's output.  killed_ok: its end by SIGTERM is success (the
    requeue of our own job ends the batch step, scontrol with it)."""
    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise CkptError("scontrol not found: ckpt slurm run needs Slurm's commands on PATH")
    except subprocess.TimeoutExpired:
        raise CkptError(f"scontrol {' '.join(args)}: no answer in 60 s")
    if done.returncode and not (killed_ok and done.returncode == -signal.SIGTERM):
        lines = done.stderr.strip().splitlines() or [f"status {done.returncode}"]
        raise CkptError(f"scontrol {' '.join(args)}: {lines[-1]}")
    return done.stdout


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

    def attach(self, job):
        """Called once the job's session runs (launch or restart)."""
        self.job = job
        job.loop.add_signal_handler(signal.SIGUSR1, self._on_signal, signal.SIGUSR1)
        job.loop.add_signal_handler(signal.SIGTERM, self._on_signal, signal.SIGTERM)
        job.finishing.append(self._finished)

    def _on_signal(self, signum):
        if self.leaving is None:
            requeue = signum == signal.SIGUSR1
            self.leaving = asyncio.ensure_future(self._leave(requeue))

    async def _leave(self, requeue):
        """Checkpoint and end the job; requeue it for USR1."""
        what = "USR1: checkpoint and requeue" if requeue else "TERM: checkpoint and end"
        _say(f"job {self.job_id}: {what}")
        taking = asyncio.ensure_future(self.job.coordinator.checkpoint(kill=True))
        try:
            timeout = None if requeue else TERM_CHECKPOINT_SECONDS
            path, _ = await asyncio.wait_for(asyncio.shield(taking), timeout)
            _say(f"job {self.job_id}: checkpoint {path}")
        except (CkptError, asyncio.TimeoutError) as exc:
            message = exc.message if isinstance(exc, CkptError) else "it took too long"
            _say(f"job {self.job_id}: the checkpoint failed ({message}); "
                 "the previous checkpoint stays")
            self.job.coordinator.kill()
        if requeue:
            await asyncio.get_running_loop().run_in_executor(None, self._requeue)

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
    job_dir = config.ckpt_dir / job_id
    latest = latest_checkpoint(job_dir) if restart_count() > 0 else None
    if latest is not None:
        _say(f"job {job_id}: requeued run {restart_count()}: restarting from {latest}")
        status = restart(latest, lambda _ckpt_dir: config, allocation_hosts(),
                         launcher="srun", on_session=signals.attach)
    else:
        status = launch(command, config, job_id, on_session=signals.attach)
    return 0 if signals.requeued else status
