"""Verbs jobs on softverbs under the InfiniBand plugin (issue 5).

Every restart reopens the device in a new adapter incarnation, so the real
LIDs and QP numbers differ from the ones the programs exchanged; the
plugin's debug lines (CKPT_IB_DEBUG) say what they became, and the tests
check that they did change.  The programs then finish as an uninterrupted
run does: the ibverbs-utils pingpongs report their iterations (rc_pingpong
validating every buffer), ud_mesh and rc_rdma check every message, payload
and RDMA transfer themselves and print the same RESULT.
"""
import re
import subprocess

import pytest

from harness import REPO, Job, Restart, restart_and_finish

SOFTVERBS = REPO / "native" / "softverbs"
IB_APPS = REPO / "integration" / "ib" / "bin"
# several seconds each (about 8 us an iteration here), after checkpoints
# (the job runs on while they are written) and a restart too
PINGPONG_ITERS = {"ud": 1000000, "rc": 700000}
REBUILT = re.compile(r"epoch (\d+): QP (0x[0-9a-f]+) is now (0x[0-9a-f]+) on LID (0x[0-9a-f]+)")
LOCAL = re.compile(r"local address:\s+LID (0x[0-9a-f]+), QPN (0x[0-9a-f]+)")


@pytest.fixture(scope="module", autouse=True)
def ib_programs():
    subprocess.run(["make", "-s", "-C", str(SOFTVERBS)], check=True)
    subprocess.run(["make", "-s", "-C", str(REPO / "integration" / "ib")], check=True)


@pytest.fixture
def verbs_session(session):
    session.extra_env.update({
        "LD_LIBRARY_PATH": str(SOFTVERBS),
        "SOFTVERBS_DIR": str(session.root / "fabric"),
        "CKPT_IB_DEBUG": "1",
    })
    return session


def pingpong_job(session, kind, port, options="", lengthen=1):
    """Server and client of ibv_<kind>_pingpong in one job, outputs in files.
    The utilities cannot be held at their end as our programs are: a test
    that checkpoints a restarted job lengthens the run instead."""
    iters = PINGPONG_ITERS[kind] * lengthen // (4 if "-e" in options else 1)  # events: slower
    prog = f"ibv_{kind}_pingpong -d sv0 -p {port} -n {iters} {options}" + \
        (" -c" if kind == "rc" else "")
    script = (f"{prog} > server.out 2>&1 & sleep 0.5; {prog} localhost > client.out 2>&1 & "
              "echo READY; wait")
    for name in ("server.out", "client.out"):
        (session.work / name).unlink(missing_ok=True)
    job = Job(session, f"{kind}-pp-{port}", ["sh", "-c", script])
    job.iters = iters
    return job


def check_pingpong_finished(session, kind, iters):
    """Both sides ran every iteration; returns {side: its output}."""
    outputs = {}
    for side in ("server", "client"):
        text = (session.work / f"{side}.out").read_text()
        assert f"{iters} iters in" in text, f"{kind} {side} did not finish:\n{text[-2000:]}"
        assert "Couldn't" not in text and "Failed" not in text, text[-2000:]
        outputs[side] = text
    return outputs


def check_new_ids(text):
    """The QP the program knows kept its number; the real one behind it and
    the LID changed at each rebuild."""
    local = LOCAL.search(text)
    assert local, text[-2000:]
    vlid, vqpn = (int(x, 16) for x in local.groups())
    rebuilt = [(e, int(q, 16), int(rq, 16), int(rl, 16))
               for e, q, rq, rl in (m.groups() for m in REBUILT.finditer(text))]
    assert rebuilt, f"no rebuild in:\n{text[-2000:]}"
    for _epoch, qpn, real_qpn, real_lid in rebuilt:
        assert qpn == vqpn
        assert real_qpn != vqpn and real_lid != vlid
    return rebuilt


@pytest.mark.parametrize("kind,options,port", [
    ("ud", "", 18600), ("rc", "", 18601),
    ("ud", "-g 0", 18602),   # global routing: GIDs in the AHs and in every receive's GRH
    ("rc", "-e", 18603),     # completion events: a thread blocked in ibv_get_cq_event
])
def test_pingpong_checkpoint_kill_restart(verbs_session, kind, options, port):
    s = verbs_session
    job = pingpong_job(s, kind, port, options)
    job.wait_ready()
    job.checkpoint_at_random_moments(1, 0.8, 1.5)
    job.kill()
    r = Restart(s, job.images[0])
    assert r.wait() == 0, r.stderr
    for text in check_pingpong_finished(s, kind, job.iters).values():
        rebuilt = check_new_ids(text)
        assert rebuilt[-1][0] == "1"  # the restart's rebuild


@pytest.mark.parametrize("kind", ["ud", "rc"])
def test_pingpong_three_checkpoints_then_a_chain(verbs_session, kind):
    """Three checkpoints in one run; restart from the last, checkpoint the
    restarted job, kill it and restart again."""
    s = verbs_session
    # the restarted run must outlast its checkpoint: the utilities cannot
    # be held, so the three checkpoints come early and the restarted job's
    # soon after it registered (twice, with 0.5-0.9 s gaps, it had ended)
    job = pingpong_job(s, kind, 18610 if kind == "ud" else 18611, lengthen=2)
    job.wait_ready()
    job.checkpoint_at_random_moments(3, 0.2, 0.5)
    job.kill()
    assert len(job.images) == 3
    restarted = Restart(s, job.images[-1])
    restarted.wait_registered(job.id)
    job.checkpoint_at_random_moments(1, 0.05, 0.3)
    s.ckpt("kill", job.id)
    restarted.wait()
    r = Restart(s, job.images[-1])
    assert r.wait() == 0, r.stderr
    for text in check_pingpong_finished(s, kind, job.iters).values():
        epochs = [e for e, *_ in check_new_ids(text)]
        assert epochs[:3] == ["1", "2", "3"] and epochs[-1] == "4", epochs


def test_ud_mesh_every_message_exactly_once(verbs_session):
    """12 processes, all-to-all over UD: checkpoints during the exchange,
    kill, restart on new ids; every message arrives once, intact."""
    s = verbs_session
    args = ["12", "1500", "1"]
    reference = s.reference([IB_APPS / "ud_mesh"], *args)
    assert "PASS" in reference
    job = Job(s, "ud-mesh", [IB_APPS / "ud_mesh"], *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(2, 0.3, 0.8)
    job.kill()
    assert restart_and_finish(s, job.images[-1], job) == reference


def checkpoints_then_restart_first_and_last(session, program, args, count, low, high):
    """count checkpoints of a verbs test program at random moments, kill,
    restart from the first and from the last image: each restart ends as
    an uninterrupted run does."""
    reference = session.reference([IB_APPS / program], *args)
    assert "PASS" in reference
    job = Job(session, program.replace("_", "-"), [IB_APPS / program], *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(count, low, high)
    job.kill()
    for image in (job.images[0], job.images[-1]):
        assert restart_and_finish(session, image, job) == reference


def test_rc_rdma_with_keys_from_before_the_checkpoint(verbs_session):
    checkpoints_then_restart_first_and_last(verbs_session, "rc_rdma", ["3000", "1"], 2, 0.3, 0.8)


def test_async_events_held_unacked_across_checkpoints(verbs_session):
    """A thread holds each async event unacked while the main thread destroys
    its QP (UCX's RC clean-up): checkpoints release and rebuild the device
    under both, a destroy still waits for the ack, and no event names a QP
    that is gone."""
    checkpoints_then_restart_first_and_last(verbs_session, "async_events", ["300", "5"],
                                            3, 0.3, 0.8)


def test_completion_channels_ready_exactly_when_an_event_waits(verbs_session):
    """A completion channel's fd, as event loops poll it, across checkpoints
    and restarts: one with an event nobody read stays readable (poll and
    epoll) and then hands out that event and its message; an idle one is
    never ready, also while a checkpoint runs; both raise new events
    after the restart through the fd numbers the program has."""
    checkpoints_then_restart_first_and_last(verbs_session, "comp_events", ["200", "10"],
                                            3, 0.2, 0.5)


def test_a_forked_child_with_its_own_device(verbs_session):
    """A verbs process forks (no exec) a child that opens the device itself:
    each rebuilds only its own objects at every checkpoint (the child has
    the parent's in its memory, and must not publish their ids as its own),
    and both go on after a restart with every message intact."""
    checkpoints_then_restart_first_and_last(verbs_session, "fork_child", ["300", "5"],
                                            3, 0.2, 0.6)
