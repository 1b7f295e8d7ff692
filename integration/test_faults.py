"""Bad input and faults, end to end: one clear line and a non-zero exit,
never a traceback or a hang; a failed checkpoint leaves the job running
and the earlier checkpoint intact."""
import json
import os
import socket
import subprocess
import sys

import pytest
import yaml
import xxhash

from ckpt.headers import load_headers
from ckpt.image import bytes_xxh3

from ckpt.launch import job_environment
from harness import APPS, REPO, Job, command, restart_and_finish

COUNTER = ["counter", "300", "10"]


def one_line(proc, *words):
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def test_static_program_is_refused(session):
    proc = session.ckpt("launch", "--", APPS / "static_hello", check=False)
    one_line(proc, "statically linked")


def test_missing_executable(session):
    proc = session.ckpt("launch", "--", "/nonexistent/app", check=False)
    one_line(proc, "/nonexistent/app")


def test_unknown_job(session):
    for cmd in ("checkpoint", "kill", "status"):
        one_line(session.ckpt(cmd, "no-such-job", check=False), "no-such-job")


def test_restart_of_garbage_directory(session):
    one_line(session.ckpt("restart", session.work, check=False))


def _checkpointed_job(session, name):
    reference = session.reference(*COUNTER)
    job = Job(session, name, *COUNTER)
    job.wait_ready()
    job.checkpoint()
    job.kill()
    image = next(job.images[0].glob("*.img"))
    return reference, job, image


def test_corrupt_image_is_refused_before_restoring(session):
    reference, job, image = _checkpointed_job(session, "corrupt")
    data = bytearray(image.read_bytes())
    good = bytes(data)
    data[len(data) // 2] ^= 0xFF
    image.write_bytes(data)
    one_line(session.ckpt("restart", job.images[0], check=False), "checksum mismatch")
    image.write_bytes(good[:-4096])
    one_line(session.ckpt("restart", job.images[0], check=False), "truncated")
    image.write_bytes(good)        # the intact image still restarts
    assert restart_and_finish(session, job.images[0], job) == reference


def _rewrite_header(image, **fields):
    """Change header fields and fix the header checksum, as another build would."""
    h = load_headers()
    raw = bytearray(image.read_bytes())
    size = h.ffi.sizeof("struct ckpt_image_header")
    header = h.ffi.cast("struct ckpt_image_header *", h.ffi.from_buffer(raw))
    for k, v in fields.items():
        setattr(header, k, v)
    header.header_xxh = 0
    header.header_xxh = xxhash.xxh3_64_intdigest(bytes(raw[:size]))
    image.write_bytes(raw)
    return bytes_xxh3(bytes(raw))


def test_image_of_another_architecture_or_version(session):
    _, job, image = _checkpointed_job(session, "foreign")
    manifest = job.images[0] / "manifest.yaml"
    text = manifest.read_text()
    data = yaml.safe_load(text)
    good = image.read_bytes()
    for fields, words in (({"arch": 183}, "aarch64"), ({"format_version": 99}, "format version")):
        new = _rewrite_header(image, **fields)
        old = next(p["xxh3"] for p in data["processes"] if p["image"] == image.name)
        manifest.write_text(text.replace(old, new))
        one_line(session.ckpt("restart", job.images[0], check=False), words)
        image.write_bytes(good)
        manifest.write_text(text)
    manifest.write_text(json.dumps(dict(data, engine_version="9.9.9")))
    one_line(session.ckpt("restart", job.images[0], check=False), "engine")


@pytest.mark.skipif(os.getuid() != 0, reason="mounting a small tmpfs needs root")
def test_full_disk_abandons_checkpoint_and_job_keeps_running(session):
    fs = session.root / "small-fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=7m", "tmpfs", fs], check=True)
    try:
        reference = session.reference(*COUNTER)
        job = _launch_with_dir(session, "full", fs, COUNTER)
        job.wait_ready()
        first = job.checkpoint()                       # about 4.5 MiB: fits
        failed = session.ckpt("checkpoint", job.id, check=False)
        line = one_line(failed, "No space left")      # the second does not
        assert job.wait() == 0, "the job must survive the failed checkpoint"
        assert job.output() == reference
        listing = session.ckpt("images", fs / "full").stdout
        assert "ckpt-0001" in listing and "\tok" in listing and "ckpt-0002" not in listing, listing
        assert not list((fs / "full").glob(".ckpt-*")), "temporary checkpoint left behind"
        assert restart_and_finish(session, first, job) == reference, line
    finally:
        subprocess.run(["umount", "-l", fs])


@pytest.mark.skipif(os.getuid() != 0, reason="mounting a small tmpfs needs root")
def test_failed_checkpoint_gives_flushed_tcp_bytes_back(session):
    """tcpflood keeps its connection full both ways: FLUSH reads megabytes
    out of it before WRITE fails for want of space; RESUME must put every
    byte back, or the program sees its streams broken."""
    fs = session.root / "tiny-fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", fs], check=True)
    try:
        app = ["tcpflood", "400", "10"]
        reference = session.reference(*app)
        job = _launch_with_dir(session, "flood", fs, app)
        job.wait_ready()
        for _ in range(3):
            one_line(session.ckpt("checkpoint", job.id, check=False), "No space left")
        assert job.wait() == 0, job.output()
        assert job.output() == reference
    finally:
        subprocess.run(["umount", "-l", fs])


def _answer_until(lines, phase, on_request=None):
    """Plays the coordinator's name service until the shim answers `phase`;
    on_request(word) may send lines of its own before the answer."""
    while True:
        line = lines.readline()
        assert line, f"the shim closed its connection before answering {phase}"
        word, _, rest = line.strip().partition(" ")
        if word in ("DONE", "FAIL") and rest.split()[0] == phase:
            return word
        if word in ("DONE", "FAIL", "WARN"):
            continue
        if on_request:
            on_request(word)
        lines.write(("OK" if word in ("PUT", "MPUT", "CLAIM") else "NONE") + "\n")


def test_resume_abort_before_a_name_service_answer_is_kept(session):
    """The coordinator sends RESUME abort to every process as soon as one
    fails, also to one still in WRITE, whose name-service request (was it
    thawed?) then finds the PHASE line before its answer.  The shim must
    take RESUME once WRITE is answered, not as the answer: it lost it, the
    application stayed parked and its TCP peers' give-back timed out (the
    flaky test_failed_checkpoint_gives_flushed_tcp_bytes_back)."""
    path = session.root / "coord.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(30)
    env = job_environment(REPO / "native" / "libckpt.so",
                          dict(session.env(), CKPT_COORD=str(path), CKPT_JOB_ID="race"))
    with open(session.work / "race.out", "w") as out:
        app = subprocess.Popen(command(*COUNTER), env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        conn, _ = server.accept()
        conn.settimeout(30)  # a lost RESUME fails the test, never hangs it
        lines = conn.makefile("rw", buffering=1)
        assert lines.readline().startswith("HELLO ")
        lines.write("WELCOME race\n")
        for phase in ("SUSPEND 1", "DRAIN 1", "FLUSH 1 " + "ab" * 16):
            lines.write(f"PHASE {phase}\n")
            assert _answer_until(lines, phase.split()[0]) == "DONE"
        (session.images / "race").mkdir()
        sent = []

        def abort_first(word):
            if not sent:
                sent.append(word)
                lines.write("PHASE RESUME 1 abort\n")

        lines.write(f"PHASE WRITE 1 {session.images / 'race'}\n")
        _answer_until(lines, "WRITE", abort_first)
        assert sent, "WRITE asked the name service nothing"
        assert _answer_until(lines, "RESUME") == "DONE"
        conn.close()
        assert app.wait(timeout=60) == 0
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
        server.close()
    assert "PASS" in (session.work / "race.out").read_text()


def _launch_with_dir(session, job_id, ckpt_dir, app_args):
    saved = session.images
    session.images = ckpt_dir
    try:
        return Job(session, job_id, *app_args)
    finally:
        session.images = saved


def test_unwritable_ckpt_dir_abandons_checkpoint(unprivileged_session):
    s = unprivileged_session
    reference = s.reference(*COUNTER)
    job = Job(s, "ro", *COUNTER)
    job.wait_ready()
    first = job.checkpoint()
    os.chmod(s.images / "ro", 0o555)             # no more checkpoints can be written
    try:
        one_line(s.ckpt("checkpoint", job.id, check=False), "ermission denied")
    finally:
        os.chmod(s.images / "ro", 0o755)
    assert job.wait() == 0
    assert job.output() == reference
    assert "\tok" in s.ckpt("images", s.images / "ro").stdout
    assert restart_and_finish(s, first, job) == reference


def test_exited_main_thread_is_refused_and_job_keeps_running(session):
    reference = session.reference("main_exits")
    job = Job(session, "main-exits", "main_exits")
    job.wait_ready()
    one_line(session.ckpt("checkpoint", job.id, check=False), "main thread has exited")
    assert job.wait() == 0
    assert job.output() == reference


def test_file_of_an_exited_thread_is_refused_and_job_keeps_running(session):
    """An fd on /proc/self/task/<tid>/stat of a thread that has exited: no
    restart could give it back (issue 37), so the checkpoint says so in
    one line and the program runs on."""
    reference = session.reference("task_fds_exited", "100", "10")
    job = Job(session, "task-exited", "task_fds_exited", "100", "10")
    job.wait_ready()
    one_line(session.ckpt("checkpoint", job.id, check=False), "which has exited")
    job.hold.unlink(missing_ok=True)
    assert job.wait() == 0
    assert job.output() == reference


# Fills a TCP connection, then half closes it: one end is established,
# the other (FIN_WAIT1, its FIN behind the bytes it holds) is not.
HALF_CLOSED = """
import os, socket, sys, time
listener = socket.create_server(("127.0.0.1", 0))
writer = socket.create_connection(listener.getsockname())
reader, _ = listener.accept()
writer.setblocking(False)
pattern = bytes(range(256)) * 256
sent = 0
try:
    while True:
        sent += writer.send(pattern[sent % 256:] + pattern[:sent % 256])
except BlockingIOError:
    pass
writer.shutdown(socket.SHUT_WR)
print("READY", sent, flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
got = bytearray()
while chunk := reader.recv(1 << 20):
    got += chunk
expected = (pattern * (len(got) // len(pattern) + 1))[:len(got)]
print("received", len(got), "intact" if got == expected else "CORRUPT", flush=True)
"""


def test_half_closed_connection_is_not_flushed(session):
    """A connection one end has half closed is not flushed from the other
    end either (the marker would land in the stream): the checkpoint fails
    cleanly, and every byte reaches the reader intact."""
    go = session.work / "go"
    job = Job(session, "half", [sys.executable, "-c", HALF_CLOSED], go)
    job.wait_ready()
    sent = int(job.output().split()[1])
    one_line(session.ckpt("checkpoint", job.id, check=False), "TCP bytes not taken by the receiver")
    go.touch()
    assert job.wait() == 0
    assert f"received {sent} intact\n" in job.output(), job.output()


# A packet socket with a receive ring mapped: the kernel writes frames
# into that memory, which an image cannot hold.
PACKET_RING = """
import mmap, os, socket, struct, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
block, count = 1 << 16, 4
s.setsockopt(263, 5, struct.pack("IIII", block, count, 2048, block * count // 2048))
ring = mmap.mmap(s.fileno(), block * count)  # SOL_PACKET, PACKET_RX_RING above
print("READY", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("ring still", len(ring), flush=True)
"""


@pytest.mark.skipif(os.getuid() != 0, reason="packet sockets need CAP_NET_RAW")
def test_packet_socket_ring_is_refused_and_job_keeps_running(session):
    go = session.work / "go"
    job = Job(session, "ring", [sys.executable, "-c", PACKET_RING], go)
    job.wait_ready()
    one_line(session.ckpt("checkpoint", job.id, check=False), "socket's ring buffer is mapped",
             "not supported")
    go.touch()
    assert job.wait() == 0
    assert "ring still 262144\n" in job.output(), job.output()
