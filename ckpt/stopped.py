"""Stopped processes: each one found stopped at the start of a checkpoint
is thawed by a tracer of its own (ckpt/thaw.py) for the checkpoint, and
frozen again before its application could run.  Only its own host can
look at it (/proc, ptrace): the coordinator thaws its host's, each other
host's agent that host's (AgentThawed, docs/PROTOCOL.md "Host agents")."""

import asyncio
import os
import subprocess
import sys
from itertools import groupby
from operator import attrgetter

from ckpt.barrier import PhaseError

PARKING_BIT = 1 << (33 - 1)
THAW_TIMEOUT = 30.0


def _status(pid, tid=None):
    path = f"/proc/{pid}/status" if tid is None else f"/proc/{pid}/task/{tid}/status"
    fields = {}
    with open(path) as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def is_stopped(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def refusal(proc):
    """Why a stopped process cannot be thawed, or None."""
    pid = proc.real_pid
    try:
        status = _status(pid)
        if int(status.get("TracerPid", "0")):
            return (f"{proc.describe()} is stopped and traced by pid {status['TracerPid']} "
                    "(a debugger?): not supported")
        shared = int(status.get("ShdPnd", "0"), 16)
        for tid in os.listdir(f"/proc/{pid}/task"):
            t = _status(pid, tid)
            waiting = (shared | int(t["SigPnd"], 16)) & ~int(t["SigBlk"], 16) & ~PARKING_BIT
            if waiting:
                sig = (waiting & -waiting).bit_length()
                return (f"{proc.describe()} is stopped with signal {sig} pending: "
                        "not supported yet")
    except (OSError, KeyError, ValueError) as exc:
        return f"{proc.describe()} is stopped and cannot be looked at: {exc}"
    return None


class Thawed:
    """One stopped process under its tracer, for one checkpoint."""

    def __init__(self, proc):
        self.proc = proc
        self.tracer = subprocess.Popen(
            [sys.executable, "-m", "ckpt.thaw", str(proc.real_pid)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        self.procs = [proc]
        self.app_frozen = False
        self.done = False

    async def _answer(self, command=None):
        loop = asyncio.get_running_loop()
        if command is not None:
            self.tracer.stdin.write(command + "\n")
            self.tracer.stdin.flush()
        try:
            line = await asyncio.wait_for(
                loop.run_in_executor(None, self.tracer.stdout.readline), THAW_TIMEOUT)
        except asyncio.TimeoutError:
            line = "error no answer"
        word, _, rest = line.strip().partition(" ")
        if word not in ("thawed", "ok"):
            self.done = True
            raise PhaseError(f"{self.proc.describe()} is stopped and could not be "
                             f"thawed for the checkpoint: {rest or 'tracer ended'}")

    async def start(self):
        await self._answer()

    async def freeze_app(self):
        if not self.app_frozen and not self.done:
            self.app_frozen = True
            await self._answer("freeze-app")

    async def freeze(self):
        """Everything stopped again; the tracer ends."""
        if self.done:
            return
        self.done = True
        try:
            if not self.app_frozen:
                await self._answer("freeze-app")
            await self._answer("freeze-ckpt")
        finally:
            self.tracer.stdin.close()
            # reaped: an agent, unlike the launcher, reaps no stray children
            await asyncio.get_running_loop().run_in_executor(None, self._reap)

    def _reap(self):
        try:
            self.tracer.wait(THAW_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.tracer.kill()   # its tracees are detached, still stopped
            self.tracer.wait()


class AgentThawed:
    """Another host's stopped processes, thawed by its agent."""

    def __init__(self, agent):
        self.agent = agent
        self.procs = []
        self.app_frozen = False
        self.done = False

    async def start(self, group):
        self.procs = await self.agent.thaw(group)

    async def freeze_app(self):
        if not self.app_frozen and not self.done and self.procs:
            self.app_frozen = True
            await self.agent.freeze_app()

    async def freeze(self):
        if self.done:
            return
        self.done = True
        if self.procs:
            await self.agent.freeze()


def _stopped_here(procs):
    """The stopped ones of this host's procs; PhaseError if one cannot be thawed."""
    stopped = [p for p in procs if p.agent is None and is_stopped(p.real_pid)]
    for proc in stopped:
        why = refusal(proc)
        if why:
            raise PhaseError(why)
    return stopped


def _by_agent(procs):
    by_agent = {}
    # a host's processes come one after another (they joined so): a run
    # at a time, as the barriers group them
    for agent, run in groupby(procs, key=attrgetter("agent")):
        if agent is not None:
            by_agent.setdefault(agent, []).extend(run)
    return by_agent


async def find(procs):
    """The stopped ones among procs (another host's: asked of its agent,
    every host at once); PhaseError if one cannot be thawed."""
    stopped = _stopped_here(procs)
    by_agent = _by_agent(procs)
    results = await asyncio.gather(*(agent.find_stopped(group) for agent, group in by_agent.items()),
                                   return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
        stopped.extend(result)
    return stopped


async def thaw(procs):
    """Thaw the stopped ones among procs (another host's: by its agent);
    a refusal or failure raises PhaseError (nothing is left thawed).
    Returns the thawed, each with the processes it stands for (.procs)."""
    stopped = _stopped_here(procs)
    by_agent = _by_agent(procs)
    thawed = []
    try:
        for proc in stopped:
            t = Thawed(proc)
            thawed.append(t)
            await t.start()
        # every host at once: one round trip, not one per host
        remote = [AgentThawed(agent) for agent in by_agent]
        thawed.extend(remote)
        results = await asyncio.gather(*(t.start(by_agent[t.agent]) for t in remote),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
    except BaseException:
        await freeze(thawed)
        raise
    return [t for t in thawed if t.procs]


async def freeze_app(thawed):
    for t in thawed:
        await t.freeze_app()


async def freeze(thawed):
    for t in thawed:
        try:
            await t.freeze()
        except PhaseError:
            pass  # its tracer is gone: the kernel detached it, stopped
