"""A stand-in for the shim's checkpoint thread, in Python, for tests.

It speaks the process side of docs/PROTOCOL.md and writes images with a
valid header, so the coordinator, manifest and restart checks can be
exercised without native code.  `python3 -m tests.fakeshim` runs one fake
process against $CKPT_COORD until the coordinator goes away.
"""

import asyncio
import os
import socket
import sys
from pathlib import Path


from ckpt.headers import load_headers
from ckpt.image import bytes_xxh3, header_checksum, host_arch
from ckpt.wire import escape, split_line, unescape


def make_image(pid, payload=b"", headers=None, **overrides):
    """Bytes of an image file: a checked header, then `payload`."""
    headers = headers or load_headers()
    ffi, const = headers.ffi, headers.const
    size = const("CKPT_HEADER_SIZE")
    raw = bytearray(size)
    header = ffi.cast("struct ckpt_image_header *", ffi.from_buffer(raw))
    header.magic = const("CKPT_IMAGE_MAGIC")
    header.format_version = const("CKPT_IMAGE_VERSION")
    header.arch = host_arch()
    header.page_size = const("CKPT_PAGE_SIZE")
    header.header_size = size
    header.pid = pid
    header.nthreads = 1
    for name, value in overrides.items():
        setattr(header, name, value)
    header.header_xxh = header_checksum(headers, raw)
    return bytes(raw) + payload


class FakeProcess:
    """One fake process.  `script` maps a phase name to an action:
    'fail', 'hang', 'disconnect', 'warn <text>' (then DONE); default: DONE."""

    def __init__(self, socket_path, pid, *, restored=False, host="fakehost", script=None,
                 payload=b"x" * 1000):
        self.socket_path = str(socket_path)
        self.pid = pid
        self.restored = restored
        self.host = host
        self.script = dict(script or {})
        self.payload = payload
        self.phases = []           # (name, arg) in the order received
        self.seqs = []             # the seq of each PHASE
        self.welcome = None
        self.answers = asyncio.Queue()  # OK / VAL / NONE replies to PUT and GET
        self.reader = self.writer = None
        self.closed = asyncio.Event()
        self._task = None

    async def connect(self):
        self.reader, self.writer = await asyncio.open_unix_connection(self.socket_path)
        await self.send(f"HELLO {self.pid} {int(self.restored)} {self.host} "
                        f"{load_headers().const('CKPT_PROTOCOL_VERSION')}")
        self.welcome = (await self.reader.readline()).decode().strip()
        self._task = asyncio.ensure_future(self._serve())
        return self

    async def send(self, line):
        self.writer.write(line.encode() + b"\n")
        await self.writer.drain()

    async def put(self, key, value):
        await self.send(f"PUT {key} {value}")
        return await self.answers.get()

    async def get(self, key):
        await self.send(f"GET {key}")
        return await self.answers.get()

    async def close(self):
        if self.writer is not None:
            self.writer.close()
        if self._task is not None:
            self._task.cancel()
        self.closed.set()

    async def _serve(self):
        try:
            while line := await self.reader.readline():
                word, rest = split_line(line)
                if word == "PHASE":
                    if not await self._phase(rest):
                        break
                else:
                    self.answers.put_nowait(line.decode().strip())
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.writer.close()
            self.closed.set()

    async def _phase(self, rest):
        name, seq, *arg = rest.split(" ")
        arg = " ".join(arg) if arg else None   # WRITE: the directory, then its words
        self.phases.append((name, arg))
        self.seqs.append(int(seq))
        action = self.script.get(name if name != "RESUME" else f"RESUME {arg}", self.script.get(name))
        if action == "hang":
            return True
        if action == "disconnect":
            return False
        if action and action.startswith("warn "):
            await self.send(f"WARN {escape(action[5:])}")
        if action == "fail":
            await self.send(f"FAIL {name} 5 fake failure in {name}")
            return True
        await self.send(f"DONE {name} 0 {self._keys(name, arg)}".rstrip())
        return True

    def _keys(self, name, arg):
        if name == "SUSPEND":
            return "threads=1"
        if name == "WRITE":
            data = make_image(self.pid, self.payload)
            filename = f"proc-{self.pid}.img"
            directory = arg.split(" ", 1)[0]  # WRITE's words follow it
            Path(unescape(directory), filename).write_bytes(data)
            return (f"file={escape(filename)} size={len(data)} "
                    f"xxh3={bytes_xxh3(data)} write_ns=1000")
        if name == "RESUME":
            return "stopped_ns=2000"
        return ""


async def _main():
    fake = FakeProcess(os.environ["CKPT_COORD"], int(os.environ.get("FAKESHIM_PID", os.getpid())),
                       restored=os.environ.get("FAKESHIM_RESTORED") == "1",
                       host=socket.gethostname())
    await fake.connect()
    await fake.closed.wait()


if __name__ == "__main__":
    try:
        asyncio.run(_main())
    except (ConnectionError, KeyError, KeyboardInterrupt) as exc:
        print(f"fakeshim: {exc}", file=sys.stderr)
        sys.exit(1)
