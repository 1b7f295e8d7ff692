"""A barrier: one PHASE line to every process, then all of their answers.

The coordinator's unit of work (docs/PROTOCOL.md): every checkpoint and
restart phase is one barrier over the job's registered processes.
"""

import asyncio
import os
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter
from types import MappingProxyType

from ckpt.wire import parse_keys, unescape


AGENT_MARGIN = 5.0  # the link's own delay on top of an agent's timeout
# the DONE keys of a process that had nothing to say: one shared, read-only
# mapping (a job of 100,000 processes makes no 100,000 empty dicts per phase)
NO_KEYS = MappingProxyType({})


class PhaseError(Exception):
    """A barrier failed: a FAIL answer, a timeout, or nobody left."""


@dataclass(eq=False, slots=True)
class Process:
    """One registered process: the shim's checkpoint thread on the other end."""

    pid: int           # inside its own pid namespace: the image's identity
    real_pid: int      # from SO_PEERCRED: what we can signal
    host: str
    restored: bool
    writer: asyncio.StreamWriter = None  # None: on another host, behind agent
    # its DONE/FAIL lines; None behind an agent (which answers for its
    # host): a big job's coordinator keeps no queue per process
    replies: asyncio.Queue = None
    alive: bool = True
    agent: object = None   # the AgentLink of its host, None on the coordinator's host
    tag: str = ""          # its name on the agent's link

    def __post_init__(self):
        if self.agent is None and self.replies is None:
            self.replies = asyncio.Queue()

    def wake(self):
        """It went away: a barrier waiting for its answer learns it."""
        self.alive = False
        if self.replies is not None:
            self.replies.put_nowait(None)

    async def send(self, line):
        self.writer.write(line.encode() + b"\n")
        await self.writer.drain()

    def describe(self):
        where = f" on {self.host}" if self.agent is not None else ""
        return f"process {self.pid}" + (f" (pid {self.real_pid})" if self.real_pid != self.pid else "") + where


_agent_of = attrgetter("agent")


async def barrier(phase, procs, *, timeout, arg=None, seq=0):
    """Send `PHASE <phase> <seq> [arg]` to procs and wait for every answer.

    Processes on other hosts get it through their host's agent, which
    answers for all of them at once (ckpt/agent_link.py).
    Returns ({process: DONE keys}, [processes that disconnected]); raises
    PhaseError on the first FAIL or when `timeout` seconds pass.  Its cost
    is one task per local process and per host, never per remote process."""
    line = f"PHASE {phase} {seq}" + (f" {arg}" if arg is not None else "")
    waits = {}
    by_agent = {}
    # a host's processes come one after another (they joined so): grouped
    # a run at a time, not looked at one by one in Python
    for agent, run in groupby(procs, key=_agent_of):
        if agent is not None:
            by_agent.setdefault(agent, []).extend(run)
            continue
        for proc in run:
            _drop_stale_answers(proc)
            await _send_or_mark_gone(proc, line)
            waits[asyncio.ensure_future(_answer(proc, phase))] = [proc]
    for agent, group in by_agent.items():
        waits[asyncio.ensure_future(agent.barrier(line, group, timeout))] = group
    # an agent's own timeout names its late processes: it answers first
    margin = AGENT_MARGIN if by_agent else 0
    return await _collect(phase, waits, timeout + margin)


def _drop_stale_answers(proc):
    while not proc.replies.empty():
        proc.replies.get_nowait()
    if not proc.alive:
        proc.replies.put_nowait(None)


async def _send_or_mark_gone(proc, line):
    if not proc.alive:
        return
    try:
        await proc.send(line)
    except (ConnectionError, OSError):
        proc.replies.put_nowait(None)


async def _answer(proc, phase):
    """({proc: its DONE keys for `phase`}, []), or ({}, [proc]) if it disconnected."""
    while True:
        answer = await proc.replies.get()
        if answer is None:
            return {}, [proc]
        word, rest = answer
        name, _, tail = rest.partition(" ")
        if name != phase:
            continue  # late answer to an earlier, aborted phase
        if word == "FAIL":
            err, _, message = tail.partition(" ")
            reason = unescape(message) or (os.strerror(int(err)) if err.isdigit() else err)
            raise PhaseError(f"{phase} failed in {proc.describe()}: {reason}")
        _status, _, keys = tail.partition(" ")
        return {proc: parse_keys(keys.split())}, []


async def _collect(phase, waits, timeout):
    if not waits:
        return {}, []
    done, pending = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
    for task in pending:
        task.cancel()
    for task in done:
        if task.exception() is not None:
            raise PhaseError(str(task.exception()))
    if pending:
        late = ", ".join(_describe_group(waits[t]) for t in pending)
        raise PhaseError(f"{phase} timed out after {timeout:g} s waiting for {late}")
    answers, gone = {}, []
    for task in done:
        some, left = task.result()
        answers.update(some)
        gone.extend(left)
    return answers, gone


def _describe_group(procs):
    if len(procs) <= 3:
        return ", ".join(p.describe() for p in procs)
    return f"{len(procs)} processes on {procs[0].host}"
