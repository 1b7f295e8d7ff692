"""End-to-end checkpoint/restart of the self-verifying test programs.

For each program: an uninterrupted run gives the reference output; then
the program runs under `ckpt launch`, is checkpointed three times at
random moments, killed, and restarted from the first and from the last
image: each restarted run must end with exactly the reference output.
"""
import ctypes
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness import APPS, Job, Restart, restart_and_finish
from ckpt.headers import load_headers

# program, arguments: steps of activity for a second or two (the harness
# holds each program at its end until the test is done with it)
PROGRAMS = {
    "counter": ["150", "10"],
    "threads": ["250", "5"],
    "bigmem": ["200", "10", "512"],
    "files": ["150", "10", "."],
    "itimer": ["150"],
    "rseq_vdso": ["125", "10"],
    "rseq_own": ["150", "10"],
    "pending_siginfo": ["150", "10"],
    "join": ["150", "10"],
    "sharedmem": ["125", "10", "."],
    "proctree": ["150", "10"],
    "sockets": ["150", "10", "."],
    "eventfds": ["150", "10"],
    "fifos": ["150", "10", "."],
    "tcpflood": ["200", "10"],
    "guard_pages": ["150", "10", "."],
    "private_maps": ["150", "10", "."],
    "socket_states": ["150", "10"],
    "socket_backlog": ["150", "10"],
    "accept_threads": ["150", "10"],
    "tcp_shutdowns": ["150", "10"],
    "socket_filter": ["150", "10"],
    "mq_notify": ["150", "10"],
    "pipe_states": ["150", "10"],
    "pipe_reopen": ["150", "10"],
    "file_reopen_fork": ["150", "10"],
    "socket_dead_peers": ["150", "10"],
    "mem_droppable": ["150", "10"],
    "unlinked_private_maps": ["150", "10", "."],
    "ctty_reopen": ["150", "10"],
    "proc_maps_peers": ["150", "10"],
    "deleted_in_removed_dir": ["150", "10", "."],
    "socket_dgram_dead_peers": ["150", "10", "."],
    "ctty_shared_fork": ["150", "10"],
    "pipe_orphans": ["150", "10", "."],
    "task_fds": ["150", "10"],
    "unlinked_maps_no_fd": ["150", "10", "."],
    "task_fds_fork": ["150", "10"],
    "file_locks": ["150", "10", "."],
    "posix_timers": ["150", "10"],
    "proc_attrs": ["150", "10"],
    "pidfds": ["150", "10"],
    "mem_advice": ["150", "10"],
    "membarriers": ["150", "10"],
    "leases": ["150", "10", "."],
    "async_io": ["150", "10"],
    "inotify_watch": ["150", "10", "."],
    "inotify_queued": ["150", "10", "."],
    "file_corners": ["150", "10", "."],
    "aio_context": ["150", "10", "."],
    "ptys": ["150", "10"],
    "memfd_exec": ["150", "10"],
    "proc_files": ["150", "10"],
    "maps_reader": ["150", "10"],
    "process_limits": ["150", "10"],
    "altstacks": ["150", "10"],
    "future_locks": ["150", "10"],
    # gives up root's capabilities: only root has them to give up
    **({"capabilities": ["150", "10"]} if os.getuid() == 0 else {}),
    **({"securebits": ["150", "10"]} if os.getuid() == 0 else {}),
    # opens a virtual console and the system console: root, where they exist
    **({"consoles": ["150", "10"]}
       if os.getuid() == 0 and os.path.exists("/dev/tty5") else {}),
    # changes its group credentials: only root may
    **({"credentials": ["150", "10"]} if os.getuid() == 0 else {}),
    # raw and packet sockets need CAP_NET_RAW
    **({"socket_protocols": ["150", "10"]} if os.getuid() == 0 else {}),
}

# what these use is the machine's, not the process's: their uninterrupted
# run must not run beside the checkpointed one
ALONE = {"consoles",  # a virtual console's settings
         "socket_protocols"}  # a packet socket sees all traffic on lo

PING_GROUPS = Path("/proc/sys/net/ipv4/ping_group_range")


@pytest.fixture(scope="module", autouse=True)
def ping_sockets_for_root():
    """socket_protocols opens an ICMP echo socket: its group (root's)
    must be within net.ipv4.ping_group_range (Debian's allows none)."""
    if os.getuid() != 0:
        yield
        return
    before = PING_GROUPS.read_text()
    PING_GROUPS.write_text("0 0")
    yield
    PING_GROUPS.write_text(before)


@pytest.mark.parametrize("app", sorted(PROGRAMS))
def test_checkpointed_runs_on_unchanged_and_restarts_from_first_and_last(session, app):
    """Three checkpoints at random moments, which the program must not
    notice: it runs to its end with an uninterrupted run's output.  Then
    restarts from the first and the last image end the same way."""
    args = PROGRAMS[app]
    if app in ALONE:
        session.reference(app, *args)
    else:
        session.start_reference(app, *args)
    job = Job(session, f"t-{app}", app, *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(3)
    reference = session.reference(app, *args)
    assert job.wait() == 0 and job.output() == reference, \
        f"{app} checkpointed differs from an uninterrupted run: {job.output()[-300:]}"
    assert len(job.images) == 3
    for image in (job.images[0], job.images[-1]):
        assert restart_and_finish(session, image, job) == reference, \
            f"{app} restarted from {image.name} differs from an uninterrupted run"


@pytest.mark.parametrize("app", ["counter", "threads", "bigmem", "files", "itimer", "tcpflood",
                                 "guard_pages", "private_maps", "sharedmem", "mem_advice",
                                 "aio_context", "pending_siginfo"])
def test_in_place_checkpoints(session, app):
    """--in-place: the job stays stopped until its images are written (the
    default has a copy-on-write child write them while the job runs on);
    the images must be as good."""
    args = PROGRAMS[app]
    reference = session.reference(app, *args)
    job = Job(session, f"f-{app}", app, *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(2, 0.05, 0.4, "--in-place")
    job.kill()
    for image in job.images:
        manifest = (image / "manifest.yaml").read_text()
        assert "write_ns" in manifest and "size" in manifest
        assert restart_and_finish(session, image, job) == reference


def test_locked_memory_through_a_forked_write(session):
    """Without DONTFORK or WIPEONFORK memory the image is written by a
    forked child, which inherits no mlock: the locks are read before it
    exists."""
    args = [*PROGRAMS["mem_advice"], "forkable"]
    reference = session.reference("mem_advice", *args)
    job = Job(session, "forked-mem-advice", "mem_advice", *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(1)
    job.kill()
    written = [p["written"] for p in yaml.safe_load((job.images[0] / "manifest.yaml").read_text())["processes"]]
    assert written == ["forked"], written
    assert restart_and_finish(session, job.images[0], job) == reference


@pytest.mark.parametrize("app", ["counter", "threads", "files", "proctree", "sockets", "fifos",
                                 "tcpflood", "private_maps", "posix_timers", "pending_siginfo"])
def test_restart_twice_in_a_chain(session, app):
    """Checkpoint a restarted job again, kill it, and restart that image."""
    args = PROGRAMS[app]
    reference = session.reference(app, *args)
    job = Job(session, f"c-{app}", app, *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(1)
    job.kill()

    restarted = job.restart_held(job.images[0])
    job.checkpoint_at_random_moments(1, low=0.3, high=0.6)
    job.kill()
    restarted.wait()
    assert job.images[1] != job.images[0]
    assert restart_and_finish(session, job.images[1], job) == reference


# Launches the rest of its command line as a container's exec does: in a
# pid namespace whose init is not its session leader, so the job sees its
# session as 0, and in a process group led by neither the job nor `ckpt
# launch` (as a test runner's group is).
IN_CONTAINER = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable,
                "-c", """
import os, subprocess, sys
child = os.fork()
if child == 0:
    os.setpgid(0, 0)
    sys.exit(subprocess.call(sys.argv[1:]))
sys.exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
"""]


@pytest.mark.skipif(os.getuid() != 0, reason="unshare --pid needs root")
def test_session_outside_the_namespace(session):
    """A job whose session leader was outside its pid namespace (getsid()
    is 0) gets back its process groups and an invisible session."""
    args = PROGRAMS["proctree"]
    # its pids mean nothing out here: it checkpoints itself, and is killed
    # with its namespace
    job = Job(session, "ns-proctree", "proctree", *args, prefix=IN_CONTAINER,
              launch_args=["--interval", "0.3"])
    job.wait_ready()
    first = session.images / "ns-proctree" / "ckpt-0001"
    while not first.is_dir():
        assert job.proc.poll() is None, f"job ended: {job.proc.stderr.read()}"
        time.sleep(0.05)
    job.proc.kill()
    job.wait()
    reference = Job(session, "ns-reference", "proctree", *args, prefix=IN_CONTAINER)
    assert reference.wait() == 0
    assert restart_and_finish(session, first, job) == reference.output()


@pytest.mark.parametrize("app", ["counter", "threads", "files", "join", "rseq_vdso",
                                 "private_maps"])
def test_unprivileged_user(unprivileged_session, app):
    """The whole cycle as a non-root user: restart needs no privilege."""
    s = unprivileged_session
    args = PROGRAMS[app]
    s.start_reference(app, *args)
    job = Job(s, f"u-{app}", app, *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(2)
    job.kill()
    assert restart_and_finish(s, job.images[0], job) == s.reference(app, *args)


# A descriptor sent over a Unix socket and not yet received, then the
# message taken once the file "go" exists: what came with it.
FDS_IN_FLIGHT = r"""
import os, socket, time
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
r, w = os.pipe()
os.write(w, b"carried")
socket.send_fds(a, [b"message"], [r])
os.close(r)
print("READY", flush=True)
while not os.path.exists("go"):
    time.sleep(0.01)
data, fds, _flags, _addr = socket.recv_fds(b, 100, 4)
print("RECEIVED", data.decode(), [os.read(fd, 100).decode() for fd in fds], flush=True)
"""


def test_descriptors_in_flight_are_named(session):
    """A descriptor in flight on a Unix socket (SCM_RIGHTS, not yet
    received) is not saved: the checkpoint says so in one line, and the
    job still receives it (the checkpoint's peek took nothing); after a
    restart the message comes without it."""
    job = Job(session, "fds-in-flight", [sys.executable, "-c", FDS_IN_FLIGHT])
    job.wait_ready()
    checkpoint = session.ckpt("checkpoint", job.id)
    said = [line for line in checkpoint.stderr.splitlines() if "SCM_RIGHTS" in line]
    assert len(said) == 1 and "1 file descriptor(s)" in said[0], checkpoint.stderr
    (session.work / "go").touch()
    assert job.wait() == 0
    assert "RECEIVED message ['carried']" in job.output(), job.output()
    image = Path(checkpoint.stdout.strip().splitlines()[-1])
    assert "RECEIVED message []\n" in restart_and_finish(session, image, job)


# A TCP connection inside the job with an urgent byte queued.
URGENT_BYTE = r"""
import socket, time
listener = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(listener.getsockname())
server, _ = listener.accept()
client.send(b"data")
client.send(b"!", socket.MSG_OOB)
time.sleep(0.2)
print("READY", flush=True)
time.sleep(30)
"""


def test_tcp_urgent_byte_is_named(session):
    """TCP urgent data (MSG_OOB) is not saved: the checkpoint says so."""
    job = Job(session, "urgent-byte", [sys.executable, "-c", URGENT_BYTE])
    job.wait_ready()
    checkpoint = session.ckpt("checkpoint", job.id)
    said = [line for line in checkpoint.stderr.splitlines() if "MSG_OOB" in line]
    assert len(said) == 1 and "urgent byte" in said[0], checkpoint.stderr
    job.kill()


def test_unlinked_private_map_is_named(session):
    """A private map of an unlinked file no fd holds: the file's bytes under
    the process's copies cannot be saved unprivileged, and the checkpoint
    says so once per map; a file still open is mapped again at restart."""
    job = Job(session, "w-private_maps", "private_maps", *PROGRAMS["private_maps"])
    job.wait_ready()
    stderr = session.ckpt("checkpoint", job.id).stderr
    job.kill()
    named = [line for line in stderr.splitlines() if "deleted-private" in line]
    assert len(named) == 1 and "not open" in named[0], stderr
    assert "deleted-shared" not in stderr and "memfd:" not in stderr, stderr


def test_exec_with_a_scrubbed_environment(session):
    """`env -i` drops LD_PRELOAD and CKPT_*: the shim's exec wrappers put
    them back, so the program it runs is part of the job and restarts."""
    args = PROGRAMS["counter"]
    reference = session.reference("counter", *args)
    job = Job(session, "scrubbed", ["env", "-i", APPS / "counter"], *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(2)
    job.kill()
    manifest = yaml.safe_load((job.images[-1] / "manifest.yaml").read_text())
    assert len(manifest["processes"]) == 1, manifest
    assert restart_and_finish(session, job.images[-1], job) == reference


def test_shell_steps_share_their_output_file(session):
    """`sh -c 'a; b' > out`: sh and its children share one open file (one
    offset) for stdout; after a restart during a, b must go on writing
    where a stopped, not where sh's copy was at the checkpoint."""
    counter = APPS / "counter"
    script = ["sh", "-c", f"{counter} 150 10; {counter} 100 10"]
    reference = session.reference(script)
    job = Job(session, "steps", script)
    job.wait_ready()
    job.checkpoint_at_random_moments(2, 0.1, 0.4)
    job.kill()
    assert restart_and_finish(session, job.images[-1], job) == reference


def test_children_forked_during_the_checkpoint(session):
    """forker forks a child every few milliseconds: checkpoints land while
    a child is being forked, before its HELLO reached the coordinator.  The
    checkpoint takes it in (else the restarted parent waits for a child
    that is not there); every image must finish like the reference."""
    args = ["1500", "3"]
    reference = session.reference("forker", *args)
    assert "PASS" in reference
    job = Job(session, "forker", "forker", *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(6, 0.05, 0.3)
    job.kill()
    for image in session.rng.sample(job.images, 3):
        assert restart_and_finish(session, image, job) == reference, image.name


def check_whole_tree_restarts(session, app, processes):
    """Two checkpoints, kill: the last image holds all `processes`, and its
    restart ends like an uninterrupted run."""
    args = ["300", "10"]
    reference = session.reference(app, *args)
    assert "PASS" in reference
    job = Job(session, app, app, *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(2, 0.2, 0.5)
    job.kill()
    manifest = yaml.safe_load((job.images[-1] / "manifest.yaml").read_text())
    assert len(manifest["processes"]) == processes, manifest
    assert restart_and_finish(session, job.images[-1], job) == reference


def test_system_v_semaphores_and_message_queues(session):
    """A semaphore set and a keyed message queue (System V) come back with
    their ids, values, messages in order and permissions; the killed
    run's objects, left in this namespace, are removed at the end."""
    args = ["300", "10", "."]
    reference = session.reference("sysv_objects", *args)
    job = Job(session, "sysv", "sysv_objects", *args)
    job.wait_ready()
    sem, queue = (session.work / "sysv_objects.ids").read_text().split()
    try:
        job.checkpoint_at_random_moments(3)
        job.kill()
        for image in (job.images[0], job.images[-1]):
            assert restart_and_finish(session, image, job) == reference
    finally:
        subprocess.run(["ipcrm", "-s", sem, "-q", queue], capture_output=True)


def test_posix_message_queues(session):
    """A named POSIX message queue with two fds on it, an unlinked one
    shared with a child and a mailbox queue no fd holds come back with
    their messages in order, their attributes and access modes; the killed
    run's named queues, left in this namespace, are removed at the end."""
    args = ["300", "10", "."]
    reference = session.reference("mqueues", *args)
    job = Job(session, "mqueues", "mqueues", *args)
    job.wait_ready()
    names = (session.work / "mqueues.name").read_text().split()
    try:
        job.checkpoint_at_random_moments(3)
        job.kill()
        for image in (job.images[0], job.images[-1]):
            assert restart_and_finish(session, image, job) == reference
    finally:
        for name in names:
            ctypes.CDLL(None, use_errno=True).mq_unlink(name.encode())


def test_thousands_of_regions_restart_under_a_low_fd_limit(session):
    """4,000 memory regions, 2,000 of them maps of one file, restarted
    with an fd limit of 1,024 (hard): the restart holds one fd per mapped
    file, not one per region (it asked for more fds than regions)."""
    args = ["200", "10", "."]
    reference = session.reference("many_maps", *args)
    job = Job(session, "many-maps", "many_maps", *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(2)
    job.kill()
    for image in job.images:
        restart = subprocess.run(["prlimit", "--nofile=1024:1024", "--",
                                  *session.ckpt_argv("restart", image)],
                                 cwd=session.work, env=session.env(), capture_output=True,
                                 text=True, timeout=300)
        assert restart.returncode == 0, restart.stderr
        assert job.output() == reference


def test_processes_that_fork_as_they_start(session):
    """300 shells that fork and exec at once: each one's checkpoint thread
    connects while its main thread forks, and the child's first dlsym (the
    shim's execve looks the real one up) must not find the loader lock held
    by a thread the child does not have.  A regression hung within ~50."""
    loop = 'for i in $(seq 300); do bash -c "/bin/true; /bin/true"; done; echo DONE'
    try:
        proc = subprocess.run(session.ckpt_argv("launch", "--job-id", "forkstart", "--ckpt-dir",
                                                session.images, "--", "sh", "-c", loop),
                              cwd=session.work, env=session.env(), capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        session.ckpt("kill", "forkstart", check=False)
        raise AssertionError("a shell hung as it forked (the loader lock?)")
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr


def test_children_not_made_by_fork(session):
    """posix_spawn with an environment without LD_PRELOAD, and clone()
    with memory of its own (no fork handlers): both children are in every
    checkpoint, and the restarted parent gets their results and statuses."""
    check_whole_tree_restarts(session, "spawner", 3)


def test_vfork_a_daemon_and_an_orphan(session):
    """A child made by vfork and exec, a daemon made by the double fork
    (its session's leader gone, its parent outside the job) and an orphan
    left in the job's session and group: all are in the job, and the
    restarted daemon and orphan have their pid, session and group."""
    check_whole_tree_restarts(session, "daemonize", 4)


# Connects out to the test's own listeners, and to itself inside the job.
CONNECTED_OUT = """
import socket, sys, time
tcp = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
unix = socket.socket(socket.AF_UNIX)
unix.connect(sys.argv[2])
waiting = socket.socket(socket.AF_UNIX)
waiting.connect(sys.argv[2])  # not accepted yet at the checkpoint
pair = socket.socketpair()
listener = socket.create_server(("127.0.0.1", 0))
inside = socket.create_connection(listener.getsockname())
accepted, _ = listener.accept()
print("READY", tcp.fileno(), unix.fileno(), waiting.fileno(), flush=True)
time.sleep(60)
"""


def test_connections_outside_the_job_are_reported(session):
    """A checkpoint names each fd connected to a process outside the job
    and its peer; the connections inside the job are not reported."""
    with socket.create_server(("127.0.0.1", 0)) as tcp_server, \
            socket.socket(socket.AF_UNIX) as unix_server:
        unix_path = session.work / "outside.sock"
        unix_server.bind(str(unix_path))
        unix_server.listen()
        port = tcp_server.getsockname()[1]
        job = Job(session, "connected-out", [sys.executable, "-c", CONNECTED_OUT],
                  port, unix_path)
        job.wait_ready()
        tcp_fd, unix_fd, waiting_fd = job.output().split()[1:4]
        accepted = tcp_server.accept()[0], unix_server.accept()[0]
        stderr = session.ckpt("checkpoint", job.id).stderr
        job.kill()
        for conn in accepted:
            conn.close()
    outside = [line for line in stderr.splitlines() if "connected outside the job" in line]
    assert len(outside) == 3, stderr
    assert any(f"fd {tcp_fd} is connected outside the job, to TCP 127.0.0.1:{port}:" in line
               for line in outside), stderr
    for fd in unix_fd, waiting_fd:
        assert any(f"fd {fd} is connected outside the job, to Unix socket {unix_path}:" in line
                   for line in outside), stderr


# Three listeners: two whose ports TIME_WAIT holds (the server side
# closed first), one that set SO_REUSEADDR, as servers do for this, and
# one that did not, so that no bind can have its port for a minute; and
# one without either.
TIME_WAIT_LISTENERS = """
import socket, sys, time
reusing = socket.socket()
reusing.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
held = socket.socket()
plain = socket.socket()
listeners = reusing, held, plain
for listener in listeners:
    listener.bind(("127.0.0.1", 0))
    listener.listen()
ports = [listener.getsockname()[1] for listener in listeners]
for listener in reusing, held:
    for _ in range(3):
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        server.close()
        client.recv(1)
        client.close()
print("READY", *ports, flush=True)
time.sleep(float(sys.argv[1]))
for listener in listeners:
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    server.sendall(b"x")
    assert client.recv(1) == b"x"
    print("listening on", listener.getsockname()[1], "SO_REUSEADDR",
          listener.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR), flush=True)
"""


def test_listeners_bound_again_while_time_wait_holds_a_port(session):
    """Connections the server closed first leave TIME_WAIT on the listener's
    port: a restart on this host binds the listener there again.  Each
    listener keeps its own SO_REUSEADDR (the restart binds with it set).
    Where the listener had none, SO_REUSEADDR does not help: as root the
    restart ends those TIME_WAIT entries (as `ss -K` does) instead of
    waiting a minute for them."""
    job = Job(session, "time-wait", [sys.executable, "-c", TIME_WAIT_LISTENERS], "1.5")
    job.wait_ready()
    reusing, held, plain = job.output().split()[1:4]
    for port in reusing, held:
        waiting = subprocess.run(["ss", "-tan", "state", "time-wait", f"( sport = :{port} )"],
                                 capture_output=True, text=True, check=True).stdout
        assert f":{port} " in waiting, waiting
    job.checkpoint()
    job.kill()
    restart = Restart(session, job.images[0])
    assert restart.wait() == 0, restart.stderr
    output = job.output()
    assert f"listening on {reusing} SO_REUSEADDR 1\n" in output, output
    assert f"listening on {held} SO_REUSEADDR 0\n" in output, output
    if os.getuid() == 0:
        assert f"port 127.0.0.1:{held} was held by 3 connections in TIME_WAIT" in restart.stderr, \
            restart.stderr
    assert f"listening on {plain} SO_REUSEADDR 0\n" in output, output


SCRATCH_FILES = """
import os, sys, time
scratch = sys.argv[1]
os.makedirs(scratch)
empty = os.open(scratch + "/lock", os.O_RDWR | os.O_CREAT, 0o640)
data = os.open(scratch + "/data", os.O_RDWR | os.O_CREAT, 0o600)
os.write(data, b"kept" * 1000)
print("READY", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
for name, fd in ("lock", empty), ("data", data):
    st = os.fstat(fd)
    named = os.stat(scratch + "/" + name)
    print(name, "size", st.st_size, "links", st.st_nlink,
          "named", (named.st_ino == st.st_ino), "offset", os.lseek(fd, 0, os.SEEK_CUR), flush=True)
print("data", os.pread(data, 4000, 0) == b"kept" * 1000, flush=True)
"""


def test_scratch_files_gone_at_restart_are_made_again(session):
    """A job's files under /tmp are gone when it is restarted later (the
    job or the node cleaned up): the restart makes them again with their
    contents, an empty one too, under their names, in their directory."""
    scratch = Path(f"/tmp/ckpt-scratch-test-{os.getpid()}")
    go = session.work / "go"
    clean = lambda: subprocess.run(["rm", "-rf", str(scratch)], check=True)
    clean()
    try:
        job = Job(session, "scratch", [sys.executable, "-c", SCRATCH_FILES], scratch, go)
        job.wait_ready()
        job.checkpoint()
        job.kill()
        clean()
        restart = Restart(session, job.images[0])
        go.touch()
        assert restart.wait() == 0, restart.stderr
        output = job.output()
        assert "lock size 0 links 1 named True offset 0\n" in output, output
        assert "data size 4000 links 1 named True offset 4000\n" in output, output
        assert "data True\n" in output, output
        assert oct(os.stat(scratch / "lock").st_mode & 0o777) == "0o640"
    finally:
        clean()


def running_copies(app, cwd):
    """Processes of the test program app whose working directory is cwd."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit() and os.readlink(entry / "exe") == str(APPS / app)
                    and os.readlink(entry / "cwd") == str(cwd)):
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def test_a_restart_reads_the_image_once_and_checks_every_block(session):
    """Blocks of an image that hold page data alone are checked as the
    restart reads them into place (one read of the image), the others
    before anything is restored.  A byte changed in either kind ends the
    restart in one line, naming it, with nothing left running; without
    <image>.sum (an older image) the whole image is checked first."""
    args = ["300", "10", "256"]
    reference = session.reference("bigmem", *args)
    job = Job(session, "once", "bigmem", *args)
    job.wait_ready()
    checkpoint = job.checkpoint()
    job.kill()
    image = next(checkpoint.glob("*.img"))
    sums = Path(f"{image}.sum")
    size = image.stat().st_size
    assert sums.stat().st_size == 8 * -(-size // load_headers().const("CKPT_CHECKSUM_BLOCK"))
    with open(image, "r+b") as f:
        for offset, message in ((4096 + 64, "image checksum mismatch (corrupt or truncated image)"),
                                (size // 2, "image checksum mismatch in its page data")):
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0x40]))
            f.flush()
            r = Restart(session, checkpoint)
            assert r.wait() != 0
            assert message in r.stderr and "Traceback" not in r.stderr, r.stderr
            assert not running_copies("bigmem", session.work)
            f.seek(offset)
            f.write(byte)
            f.flush()
    sums.rename(f"{sums}.gone")
    assert restart_and_finish(session, checkpoint, job) == reference
