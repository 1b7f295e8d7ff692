"""DMTCP side by side (engine_bench.py's big table), when it is installed.

DMTCP is not in Debian 12: build it from its sources (github.com/dmtcp/dmtcp,
`./configure --prefix=/opt/dmtcp && make -j && make install`) and put its
bin/ on PATH, or pass --dmtcp DIR.  Measured as its users run it: no gzip,
a checkpoint through dmtcp_command, then `sync` for the image to be durable
(DMTCP does not fsync); a restart through dmtcp_restart."""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

POLL = 0.01


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find(bin_dir=None):
    """DMTCP's bin directory, or None when it is not installed."""
    if bin_dir:
        return Path(bin_dir) if (Path(bin_dir) / "dmtcp_launch").exists() else None
    found = shutil.which("dmtcp_launch") or (
        "/opt/dmtcp/bin/dmtcp_launch" if os.path.exists("/opt/dmtcp/bin/dmtcp_launch") else None)
    return Path(found).parent if found else None


def version(bin_dir):
    out = subprocess.run([bin_dir / "dmtcp_launch", "--version"], capture_output=True, text=True)
    first = out.stdout.splitlines()[:1] or ["?"]
    return first[0].split()[-1]  # "dmtcp_launch (DMTCP) 4.2.0"


class DmtcpJob:
    """One program under DMTCP, with a coordinator of its own."""

    def __init__(self, bin_dir, work, argv):
        self.bin = bin_dir
        self.dir = work / "dmtcp"
        self.dir.mkdir(exist_ok=True)
        self.port = None
        self.proc = None
        self._coordinator()
        self.out = self.dir / "launch.out"
        with open(self.out, "w") as out:
            self.proc = subprocess.Popen([self.bin / "dmtcp_launch", "-p", str(self.port),
                                          "--ckptdir", str(self.dir), "--no-gzip",
                                          *map(str, argv)],
                                         cwd=self.dir, stdout=out, stderr=subprocess.DEVNULL)
        self._wait_for_output(self.out, "READY")

    def _coordinator(self):
        self.port = free_port()
        subprocess.run([self.bin / "dmtcp_coordinator", "--daemon", "--exit-on-last",
                        "-p", str(self.port), "--ckptdir", str(self.dir)],
                       check=True, capture_output=True)

    def _command(self, *args):
        return subprocess.run([self.bin / "dmtcp_command", "-p", str(self.port), *args],
                              capture_output=True, text=True).stdout

    def _wait_for_output(self, path, text="", timeout=300):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and path.stat().st_size and text in path.read_text(errors="replace"):
                return
            time.sleep(POLL)
        raise RuntimeError(f"DMTCP: {path} never showed {text!r}")

    def images(self):
        return sorted(self.dir.glob("ckpt_*.dmtcp"))

    def checkpoint(self):
        """(seconds the program is stopped, seconds until the image is
        durable): DMTCP keeps the program stopped until its image is
        written, then `sync`."""
        for old in self.images():
            old.unlink()
        t = time.monotonic()
        self._command("-c")
        # its blocking form (-bc) returns at once in 4.2.0: poll the status
        while "RUNNING=yes" not in self._command("-s") or not self.images() \
                or list(self.dir.glob("*.temp")):
            if time.monotonic() - t > 300:
                raise RuntimeError(f"DMTCP: no checkpoint image in {self.dir} after 300 s")
            time.sleep(POLL)
        stopped = time.monotonic() - t
        os.sync()
        return stopped, time.monotonic() - t

    def stop(self):
        self._command("-q")
        if self.proc:
            self.proc.wait()
            self.proc = None

    def restart_time(self):
        """Seconds from dmtcp_restart until the program writes again (DMTCP
        gives it the restart's stdout); the restarted program is ended."""
        self.stop()
        self._coordinator()
        out = self.dir / "restart.out"
        with open(out, "w") as f:
            t = time.monotonic()
            self.proc = subprocess.Popen([self.bin / "dmtcp_restart", "-p", str(self.port),
                                          *map(str, self.images())],
                                         cwd=self.dir, stdout=f, stderr=subprocess.DEVNULL)
            self._wait_for_output(out)
            seconds = time.monotonic() - t
        return seconds
