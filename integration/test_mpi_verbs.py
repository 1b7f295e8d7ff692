"""Real MPI over InfiniBand verbs on softverbs, without ckpt (issue 13).

Debian's MPICH (ch4:ucx) and Open MPI (`--mca pml ucx`) run the MPI test
programs over UCX's verbs transports on softverbs' device: `ud_verbs` (UD, the paper's case) and
`rc_v` (RC queue pairs, `rc_verbs`, connected through `ud_verbs` as UCX's
auxiliary wire-up transport: `rc_verbs,self` alone cannot connect on any
HCA, UCX says "no auxiliary transport").  Rank 0's output must equal a run
over shared memory, and the traffic must have gone over verbs: UCX's own
report of the lanes it chose (UCX_LOG_LEVEL=info, `ep_cfg` lines) names
only the verbs transport and `self`, and softverbs' counters
(SOFTVERBS_DEBUG=1, one line per rank at close) show every rank posting
the program's messages on QPs of that type.  Open MPI's openib BTL (pml
ob1) runs them over RC queue pairs, which its UD connection manager sets
up; each rank's report of the BTL it chose for each peer names openib.  A
run over shared memory under the same library fails these checks.
"""
import os
import re
import signal
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import REPO, Job, restart_and_finish

SOFTVERBS = REPO / "native" / "softverbs"
MPI_BIN = REPO / "integration" / "mpi" / "bin"
MPIRUN = {
    "mpich": ["mpirun.mpich"],
    "openmpi": ["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe"],
}
# what makes each stack use UCX; a plain run lets it choose (shared memory)
UCX_ARGS = {"mpich": [], "openmpi": ["--mca", "pml", "ucx"]}
UCT_IB = Path("/usr/lib/x86_64-linux-gnu/ucx/libuct_ib.so.0")
# steps, ms per step: short runs, every step exchanges messages between ranks
PROGRAMS = ("ring", "allreduce", "jacobi", "bigmsg")
ARGS = ["40", "1"]
STEPS = int(ARGS[0])
MIB = 1 << 20
# UCX_TLS -> (QP type whose softverbs counters must carry the traffic,
#             transport names UCX must report)
TRANSPORTS = {
    "ud_verbs": ("ud", {"ud_verbs"}),
    "rc_v": ("rc", {"rc_verbs"}),
}
COUNTERS = re.compile(r"softverbs sv0 pid (\d+): .*? rc_wrs (\d+) rc_bytes (\d+) "
                      r"uc_wrs (\d+) uc_bytes (\d+) ud_wrs (\d+) ud_bytes (\d+)")
# QP type -> its WR count among COUNTERS' groups after the pid (bytes next)
COUNTER_COLUMN = {"rc": 0, "uc": 2, "ud": 4}
EP_CFG = re.compile(r"ep_cfg\[\d+\]: (.*)")
LANE = re.compile(r"(\w+)/([\w:]+)")


@pytest.fixture(scope="module", autouse=True)
def programs():
    if not UCT_IB.exists():
        pytest.skip("UCX's verbs transports are not installed (./setup.sh)")
    if not os.access("/dev/infiniband/uverbs0", os.R_OK | os.W_OK):
        pytest.skip("/dev/infiniband/uverbs0 is missing: ./setup.sh (as root) makes it")
    subprocess.run(["make", "-s", "-C", str(SOFTVERBS)], check=True)
    subprocess.run(["make", "-s", "-C", str(REPO / "integration" / "mpi")], check=True)


def mpirun(stack, ranks, program, env, transport=None, timeout=120):
    """Runs an MPI job in its own process group; kills the group if it
    hangs.  transport: mpirun's arguments that choose it (default: UCX).
    Returns (stdout, stderr)."""
    if shutil.which(MPIRUN[stack][0]) is None:
        pytest.skip(f"{stack} is not installed (./setup.sh)")
    argv = MPIRUN[stack] + (UCX_ARGS[stack] if transport is None else transport) + \
        ["-np", str(ranks), str(MPI_BIN / stack / program)] + ARGS
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{program} hung over {env.get('UCX_TLS')}:\n{err[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)    # ranks left behind
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, f"{program} failed ({proc.returncode}):\n{out}\n{err[-3000:]}"
    return out, err


def plain_env():
    """Real Debian libraries only: UCX picks shared memory on one host."""
    env = dict(os.environ)
    for name in ("LD_LIBRARY_PATH", "LD_PRELOAD") + tuple(k for k in env if k.startswith("UCX_")):
        env.pop(name, None)
    return env


def verbs_env(tmp_path, tls):
    env = plain_env()
    env.update(LD_LIBRARY_PATH=str(SOFTVERBS), SOFTVERBS_DIR=str(tmp_path / "fabric"),
               SOFTVERBS_DEBUG="1", UCX_TLS=f"{tls},self", UCX_LOG_LEVEL="info",
               UCX_LOG_FILE=str(tmp_path / "ucx.%p.log"))
    return env


def ucx_logs(tmp_path):
    """UCX's reports of all ranks (UCX_LOG_FILE: one file per process)."""
    return "".join(p.read_text() for p in sorted(tmp_path.glob("ucx.*.log")))


def check_verbs_carried(ucx_log, err, ranks, qp_type, transports, min_bytes):
    """UCX chose only verbs lanes (and self), and every rank posted the
    program's traffic on softverbs QPs of the expected type."""
    cfgs = EP_CFG.findall(ucx_log)
    assert cfgs, f"UCX reported no endpoint configuration:\n{ucx_log[-3000:]}"
    remote = set()
    for cfg in cfgs:
        for tl, dev in LANE.findall(cfg):
            assert tl in transports | {"self"}, f"UCX used {tl}/{dev}: {cfg}"
            if tl != "self":
                assert dev.startswith("sv0"), f"not softverbs' device: {cfg}"
                remote.add(tl)
    assert remote == transports, f"UCX lanes {remote}, wanted {transports}"
    check_counters(err, ranks, qp_type, min_bytes)


def check_counters(err, ranks, qp_type, min_bytes):
    """Every rank posted the program's traffic on softverbs QPs of qp_type
    (SOFTVERBS_DEBUG: one line of counters per process at close)."""
    counters = {int(m[0]): [int(x) for x in m[1:]] for m in COUNTERS.findall(err)}
    assert len(counters) == ranks, \
        f"softverbs counters of {len(counters)} processes, {ranks} ranks:\n{err[-3000:]}"
    column = COUNTER_COLUMN[qp_type]
    for pid, c in counters.items():
        wrs, nbytes = c[column], c[column + 1]
        assert wrs >= STEPS and nbytes >= min_bytes, \
            f"rank pid {pid} posted {wrs} {qp_type} WRs, {nbytes} bytes: {c}"


def min_bytes(program):
    # bigmsg sends 1 MiB to a neighbour each step; the others a few words
    return STEPS * MIB if program == "bigmsg" else STEPS * 8


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("tls", list(TRANSPORTS))
def test_mpich_over_verbs(tmp_path, tls, ranks, program):
    run_over_verbs(tmp_path, "mpich", tls, ranks, program)


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("tls", list(TRANSPORTS))
def test_openmpi_pml_ucx_over_verbs(tmp_path, tls, program):
    run_over_verbs(tmp_path, "openmpi", tls, 4, program)


def run_over_verbs(tmp_path, stack, tls, ranks, program):
    reference, _ = mpirun(stack, ranks, program, plain_env(), transport=[])
    assert "PASS" in reference
    out, err = mpirun(stack, ranks, program, verbs_env(tmp_path, tls))
    assert out == reference
    qp_type, transports = TRANSPORTS[tls]
    check_verbs_carried(ucx_logs(tmp_path), err, ranks, qp_type, transports,
                        min_bytes(program))


# Open MPI's openib BTL: RC queue pairs (per peer, and shared receive
# queues) connected through its UD connection manager (udcm).  Each rank
# reports the BTL it chose for every peer (btl_base_verbose).
OPENIB_ARGS = ["--mca", "pml", "ob1", "--mca", "btl", "openib,self",
               "--mca", "btl_openib_allow_ib", "1", "--mca", "btl_base_verbose", "100",
               # softverbs is in no device table of openib's, as any HCA
               # newer than Open MPI 4.1 would not be
               "--mca", "btl_openib_warn_no_device_params_found", "0"]
BTL_CHOSEN = re.compile(r"mca: bml: Using (\w+) btl for send to \[\[\d+,\d+\],(\d+)\]")


def check_openib_carried(err, ranks, min_bytes):
    """Every rank chose openib for every other rank, and its traffic went
    over softverbs' RC queue pairs."""
    chosen = BTL_CHOSEN.findall(err)
    remote = [btl for btl, _ in chosen if btl != "self"]
    assert remote and set(remote) == {"openib"}, f"BTLs chosen: {chosen}"
    assert len(remote) == ranks * (ranks - 1), f"BTLs chosen: {chosen}"
    check_counters(err, ranks, "rc", min_bytes)


@pytest.mark.parametrize("program", PROGRAMS)
def test_openmpi_openib_btl_over_verbs(tmp_path, program):
    reference, _ = mpirun("openmpi", 4, program, plain_env(), transport=[])
    assert "PASS" in reference
    out, err = mpirun("openmpi", 4, program, verbs_env(tmp_path, "rc"), transport=OPENIB_ARGS)
    assert out == reference
    check_openib_carried(err, 4, min_bytes(program))


def test_shared_memory_run_fails_the_verbs_check(tmp_path):
    """The check is not vacuous: the same job over shared memory, with
    softverbs loaded and its device visible to UCX, is caught."""
    env = verbs_env(tmp_path, "sm")
    out, err = mpirun("mpich", 2, "ring", env)
    assert "PASS" in out
    for tls, (qp_type, transports) in TRANSPORTS.items():
        with pytest.raises(AssertionError):
            check_verbs_carried(ucx_logs(tmp_path), err, 2, qp_type, transports,
                                min_bytes("ring"))
    # Open MPI with openib allowed but shared memory (vader) beside it
    out, err = mpirun("openmpi", 2, "ring", env,
                      transport=OPENIB_ARGS[:3] + ["--mca", "btl", "vader,openib,self"] +
                      OPENIB_ARGS[6:])
    assert "PASS" in out
    with pytest.raises(AssertionError):
        check_openib_carried(err, 2, min_bytes("ring"))


REBUILT = re.compile(r"ckpt-ib\[(\d+)\]: rebuilt in")


# Open MPI (pml ucx) waits in MPI_Finalize for its UD endpoints' close,
# which its peers answer from UCX's async thread, woken through an epoll
# set that watches the verbs fds: that set must watch the rebuilt fds
# (plugins/ib/epoll_watchers.c), or a restarted job hangs there.
@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("stack,tls", [("mpich", "ud_verbs"), ("mpich", "rc_v"),
                                       ("openmpi", "ud_verbs")])
def test_over_verbs_checkpoint_restart(session, stack, tls, program):
    """Under `ckpt launch` (the IB plugin): three checkpoints at random
    moments, kill, restart from the first and from the last image on a new
    adapter incarnation; the output equals an uninterrupted run's, and the
    restarted ranks went on over verbs (softverbs' counters of the contexts
    the plugin rebuilt, appended to a file at their close)."""
    checkpoint_kill_restart_over_ucx(session, stack, tls, program)


@pytest.mark.parametrize("stack,transport,program", [
    ("mpich", "ud_verbs", "ring"), ("mpich", "rc_v", "ring"),
    ("openmpi", "ud_verbs", "ring"),
    ("openmpi", "openib", "allreduce"),    # connections to every peer at once
])
def test_over_verbs_restart_chain(session, stack, transport, program):
    """A restarted job checkpointed again, killed, and that image
    restarted: it ends as an uninterrupted run, over verbs, in every
    configuration."""
    if transport == "openib":
        checkpoint_kill_restart_over_openib(session, program, chain=True)
    else:
        checkpoint_kill_restart_over_ucx(session, stack, transport, program, chain=True)


def checkpoint_kill_restart_over_ucx(session, stack, tls, program, chain=False):
    session.extra_env.update(
        UCX_TLS=f"{tls},self", UCX_LOG_LEVEL="info",
        UCX_LOG_FILE=str(session.root / "ucx.%p.log"),
        # UCX's UD endpoints give up on a peer silent for UCX_UD_TIMEOUT
        # (30 s) by the CPU's clock, which runs on while the job is down:
        # a restart from an image older than that failed ("unhandled
        # timeout error").  Set as a user restarting old images must.
        UCX_UD_TIMEOUT="10m")
    qp_type, transports = TRANSPORTS[tls]
    checkpoint_kill_restart_over_verbs(
        session, stack, UCX_ARGS[stack],
        lambda job, after_restart: check_verbs_carried(
            ucx_logs(session.root), after_restart, 4, qp_type, transports, STEPS * 8),
        program, chain)


@pytest.mark.parametrize("program", PROGRAMS)
def test_openib_btl_checkpoint_restart(session, program):
    """The same with Open MPI's openib BTL: its RC queue pairs, shared
    receive queues and UD connection manager rebuilt by the plugin.  The
    connection manager's thread waits in ibv_get_cq_event across the
    checkpoint: it must come back on the new channel, and its old fd
    number must not be read in the meantime.  Its progress thread polls
    that channel's fd while the application runs between the release and
    the checkpoint: the fd must not poll ready with no event behind it."""
    checkpoint_kill_restart_over_openib(session, program)


def checkpoint_kill_restart_over_openib(session, program, chain=False):
    checkpoint_kill_restart_over_verbs(
        session, "openmpi", OPENIB_ARGS,
        lambda job, after_restart: check_openib_carried(
            job.stderr_text() + after_restart, 4, STEPS * 8), program, chain)


# steps, ms per step of the checkpointed runs: at least 2 s of pacing, so
# that three checkpoints fit in, and not much more (bigmsg moves 1 MiB a
# step, MPICH's allreduce polls hard)
CHECKPOINTED_ARGS = {"bigmsg": ["150", "15"], "allreduce": ["150", "20"]}


def checkpoint_kill_restart_over_verbs(session, stack, transport, check_carried,
                                       program="ring", chain=False):
    """Three checkpoints, kill, restart from the first and the last image
    (chain: restart the last, checkpoint it again, kill, restart that)."""
    counters = session.root / "counters"
    session.extra_env.update(
        LD_LIBRARY_PATH=str(SOFTVERBS), SOFTVERBS_DIR=str(session.root / "fabric"),
        SOFTVERBS_DEBUG=str(counters), CKPT_IB_DEBUG="1")
    if shutil.which(MPIRUN[stack][0]) is None:
        pytest.skip(f"{stack} is not installed (./setup.sh)")
    app = MPIRUN[stack] + transport + ["-np", "4", str(MPI_BIN / stack / program)]
    args = CHECKPOINTED_ARGS.get(program, ["300", "10"])
    reference = session.reference(app, *args)
    assert "PASS" in reference
    job = Job(session, "over-verbs", app, *args, stderr_file=True)
    job.wait_ready()
    job.checkpoint_at_random_moments(3, 0.2, 0.6)
    job.kill()
    images = [job.images[0], job.images[-1]]
    if chain:
        restarted = job.restart_held(job.images[-1])
        job.checkpoint_at_random_moments(1, 0.2, 0.6)
        job.kill()
        restarted.wait()
        images = [job.images[-1]]
    for image in images:
        start = counters.stat().st_size
        assert restart_and_finish(session, image, job) == reference, \
            f"restarted from {image.name}: {job.stderr_text()[-3000:]}"
        assert len(set(REBUILT.findall(job.stderr_text()))) >= 4, \
            f"not every rank rebuilt:\n{job.stderr_text()[-3000:]}"
        check_carried(job, counters.read_text()[start:])
