"""The coordinator's side of one host agent's TCP connection
(docs/PROTOCOL.md, "Host agents").

An agent stands for every process of the job on its host: it forwards
their joining and leaving, their warnings and name-service requests, and
runs each barrier over them locally, answering for all of them in one
line.  So the coordinator has one connection per host, not per process."""

import asyncio
import json

from ckpt.barrier import AGENT_MARGIN, NO_KEYS, PhaseError, Process
from ckpt.wire import split_line, unescape


class AgentLink:
    def __init__(self, coordinator, host, reader, writer):
        self.coord = coordinator
        self.host = host
        self.reader = reader
        self.writer = writer
        self.procs = {}           # tag -> Process
        self._requests = {}       # request id -> future of the agent's ANSWERS
        self._next_request = 0
        self._tasks = set()
        self.lost = False
        self.address = _ip(writer.get_extra_info("peername"))        # the agent's host
        self.own_address = _ip(writer.get_extra_info("sockname"))    # ours, as it sees us

    def __repr__(self):
        return f"AgentLink({self.host})"

    async def send(self, line):
        self.coord.agent_messages["sent"] += 1
        self.writer.write(line.encode() + b"\n")
        await self.writer.drain()

    async def serve(self):
        """Until the agent goes away: then its host's processes are gone too."""
        messages = self.coord.agent_messages
        try:
            while line := await self.reader.readline():
                messages["received"] += 1
                await self._handle(*split_line(line))
        finally:
            self.lost = True
            self.coord.host_lost(self.host, len(self.procs))
            for future in self._requests.values():
                if not future.done():
                    future.set_result(None)
            for task in list(self._tasks):
                task.cancel()
            for proc in list(self.procs.values()):
                await self.coord.remove_process(proc)

    async def _handle(self, word, rest):
        if word == "JOIN":  # JOIN tag pid restored host real_pid
            tag, pid, restored, host, real_pid = rest.split()
            proc = Process(pid=int(pid), real_pid=int(real_pid), host=host,
                           restored=restored == "1", agent=self, tag=tag)
            self.procs[tag] = proc
            await self.coord.add_process(proc)
        elif word == "LEAVE":
            proc = self.procs.pop(rest.strip(), None)
            if proc is not None:
                await self.coord.remove_process(proc)
        elif word == "ANSWERS":  # ANSWERS id json
            ident, _, payload = rest.partition(" ")
            future = self._requests.get(int(ident))
            if future is not None and not future.done():
                future.set_result(json.loads(payload))
        elif word == "WARN":  # WARN tag message
            tag, _, message = rest.partition(" ")
            proc = self.procs.get(tag)
            who = proc.describe() if proc else f"a process on {self.host}"
            self.coord.note(f"{who}: {unescape(message)}")
        elif word == "NS":  # NS id request: answered as soon as it can be
            ident, _, request = rest.partition(" ")
            self._spawn(self._answer_names(ident, *split_line(request.encode())))
        else:
            self.coord.warn(f"the agent of {self.host} sent an unknown message {word!r}")

    def _spawn(self, coro):
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer_names(self, ident, word, rest):
        answer = await self.coord.names.answer(word, rest)
        try:
            await self.send(f"NSR {ident} {answer}")
        except (ConnectionError, OSError):
            pass

    async def _ask(self, word, rest):
        """`word <id> rest` to the agent: its `ANSWERS <id>` (a dict), or
        None if the agent is gone."""
        ident = self._next_request = self._next_request + 1
        future = asyncio.get_running_loop().create_future()
        self._requests[ident] = future
        try:
            if self.lost:
                return None
            await self.send(f"{word} {ident} {rest}".rstrip())
            return await future
        except (ConnectionError, OSError):
            return None
        finally:
            self._requests.pop(ident, None)

    async def _ask_or_fail(self, word, rest="", timeout=None):
        """The agent's answer; PhaseError if it failed, is gone or (with a
        timeout: a host that hangs) does not answer in time."""
        try:
            answer = await asyncio.wait_for(self._ask(word, rest), timeout)
        except asyncio.TimeoutError:
            raise PhaseError(f"the agent of host {self.host} did not answer {word} "
                             f"within {timeout:g} s")
        if answer is None:
            raise PhaseError(f"lost the connection to the agent of host {self.host}")
        if answer.get("fail"):
            raise PhaseError(answer["fail"])
        return answer

    async def barrier(self, phase_line, group, timeout):
        """`phase_line` to the group's processes through the agent:
        ({proc: DONE keys}, [procs that disconnected])."""
        tags = ",".join([p.tag for p in group])
        answer = await self._ask_or_fail("BARRIER", f"{timeout:g} {tags} {phase_line}")
        if answer.get("all"):
            return dict.fromkeys(group, NO_KEYS), []
        done = answer.get("done", {})
        answers = {proc: done[proc.tag] or NO_KEYS for proc in group if proc.tag in done}
        if len(answers) == len(group):
            return answers, []
        return answers, [proc for proc in group if proc.tag not in done]

    # stopped processes (ckpt/stopped.py): the agent thaws its host's own,
    # in the time a barrier has

    def _thaw_timeout(self):
        return self.coord.barrier_timeout + AGENT_MARGIN

    async def find_stopped(self, group):
        """The stopped ones of group, as the agent sees them."""
        answer = await self._ask_or_fail("STOPPED", ",".join(p.tag for p in group),
                                         self._thaw_timeout())
        stopped = set(answer.get("stopped", ()))
        return [proc for proc in group if proc.tag in stopped]

    async def thaw(self, group):
        """The agent thaws the stopped ones of group: returns them."""
        answer = await self._ask_or_fail("THAW", ",".join(p.tag for p in group),
                                         self._thaw_timeout())
        stopped = set(answer.get("stopped", ()))
        return [proc for proc in group if proc.tag in stopped]

    async def freeze_app(self):
        await self._ask_or_fail("FREEZE-APP", timeout=self._thaw_timeout())

    async def freeze(self):
        await self._ask_or_fail("FREEZE", timeout=self._thaw_timeout())

    def signal(self, signum):
        """Send signum to each of the host's processes (by the agent).
        Not waited for: the transport sends queued lines in order even
        when the coordinator closes right after."""
        if not self.lost:
            self.coord.agent_messages["sent"] += 1
            self.writer.write(f"SIGNAL {int(signum)}\n".encode())

    def close(self):
        self.writer.close()


def _ip(name):
    if not name:
        return None
    host = name[0]
    return host[7:] if host.startswith("::ffff:") else host


def describe_address(writer):
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if peer else "?"
