"""The job's processes on one host: the Unix socket their shims' checkpoint
threads connect to (docs/PROTOCOL.md).  The coordinator serves its own
host's processes with it, and each other host's agent serves that host's.

What a process says is handed to the owner's callbacks: it joined, it
left, a warning, a name-service request; DONE and FAIL answers go to the
process's reply queue, where barriers wait for them."""

import asyncio
import os
import socket
import struct

from ckpt.barrier import Process
from ckpt.wire import split_line, unescape

NAME_SERVICE = ("PUT", "MPUT", "CLAIM", "GET", "MWAIT", "INCR", "AWAIT")


def peer_credentials(writer):
    sock = writer.get_extra_info("socket")
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)  # pid, uid, gid


async def reply(writer, line):
    writer.write(line.encode() + b"\n")
    await writer.drain()


class LocalProcesses:
    """A 0600 Unix socket for the same user's processes of one job.

    joined(proc), left(proc), warned(proc, message): bookkeeping;
    name_service(word, rest) -> answer line; client(rest, writer): a CLI
    request (`CLIENT ...`), or None where CLI requests are not served."""

    def __init__(self, socket_path, *, job_id, protocol_version, line_max,
                 joined, left, warned, name_service, client=None):
        self.socket_path = str(socket_path)
        self.job_id = job_id
        self.protocol_version = protocol_version
        self.line_max = line_max
        self.joined, self.left, self.warned = joined, left, warned
        self.name_service = name_service
        self.client = client
        self._server = None
        self._writers = set()

    async def start(self):
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        old_umask = os.umask(0o177)  # the socket is born 0600
        try:
            self._server = await asyncio.start_unix_server(
                self._on_connect, path=self.socket_path, limit=2 * self.line_max)
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, 0o600)

    async def close(self):
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        try:
            os.unlink(self.socket_path)
        except OSError:
            pass

    async def _on_connect(self, reader, writer):
        self._writers.add(writer)
        try:
            _pid, uid, _gid = peer_credentials(writer)
            if uid not in (os.getuid(), 0):
                return
            word, rest = split_line(await reader.readline())
            if word == "HELLO":
                await self._serve_process(rest, reader, writer)
            elif word == "CLIENT" and self.client is not None:
                await self.client(rest, writer)
            elif word == "KV":
                await self._serve_names(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, OSError):
            pass  # a peer that vanishes or talks nonsense is simply dropped
        except asyncio.CancelledError:
            pass  # the job is over: its connections end with it, quietly
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _serve_process(self, rest, reader, writer):
        fields = rest.split()
        if len(fields) < 4:
            await reply(writer, "ERR malformed HELLO")
            return
        pid, restored, host, version = int(fields[0]), fields[1] == "1", fields[2], fields[3]
        if version != str(self.protocol_version):
            await reply(writer, f"ERR protocol version {version}, coordinator speaks {self.protocol_version}")
            return
        real_pid = peer_credentials(writer)[0]
        proc = Process(pid=pid, real_pid=real_pid, host=host, restored=restored, writer=writer)
        await proc.send(f"WELCOME {self.job_id}")
        await self.joined(proc)
        try:
            while line := await reader.readline():
                await self._handle_line(proc, *split_line(line))
        finally:
            await self.left(proc)

    async def _handle_line(self, proc, word, rest):
        if word in ("DONE", "FAIL"):
            proc.replies.put_nowait((word, rest))
        elif word == "WARN":
            self.warned(proc, unescape(rest))
        elif word in NAME_SERVICE:
            await proc.send(await self.name_service(word, rest))
        else:
            self.warned(proc, f"sent an unknown message {word!r}")

    async def _serve_names(self, reader, writer):
        """A connection of a plugin's own thread: name service only."""
        while line := await reader.readline():
            word, rest = split_line(line)
            if word not in NAME_SERVICE:
                await reply(writer, f"ERR unknown message {word}")
                return
            await reply(writer, await self.name_service(word, rest))
