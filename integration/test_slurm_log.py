"""`ckpt slurm run`'s checkpoint at USR1 shows its progress in the job's
log: lines (its stderr is a file, not a terminal), a line at each phase
with the images' bytes so far, and the checkpoint's size at the end.  Run
here outside a Slurm allocation (SLURM_JOB_ID set by hand): the launch,
the signal and the checkpoint are the real ones; only the requeue fails,
as scontrol finds no controller (integration/test_slurm_ckpt.py has the
whole cycle on the test cluster)."""
import re
import signal
import subprocess
import time

from ckpt import manifest as manifests
from ckpt.job_status import human_size
from ckpt.progress import bytes_by_host
from harness import Pause, command


def wait_for(predicate, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what()
        time.sleep(0.05)


def test_usr1_checkpoint_progress_is_lines_in_the_log(session):
    pause = Pause(session, "PUBLISH")
    job_id = "slurmlog-7"
    hold = session.work / "slurmlog.hold"
    hold.touch()
    out, log = session.work / "slurmlog.out", session.work / "slurmlog.log"
    env = {**session.env(), **pause.env, "SLURM_JOB_ID": job_id, "SLURM_RESTART_COUNT": "0",
           "ZDTM_HOLD": str(hold)}
    with open(out, "w") as stdout, open(log, "w") as stderr:
        proc = subprocess.Popen(session.ckpt_argv("slurm", "run", "--ckpt-dir", session.images,
                                                  "--", *command("counter", "600", "10")),
                                cwd=session.work, env=env, stdout=stdout, stderr=stderr)
    try:
        wait_for(lambda: "READY" in out.read_text(), lambda: f"never READY: {log.read_text()}")
        first = session.ckpt("checkpoint", job_id).stdout.strip()  # the estimate of the next
        pause.arm()
        proc.send_signal(signal.SIGUSR1)
        pause.wait(proc)
        # held before its publication: every image is written
        wait_for(lambda: "ckpt-0002 publishing" in log.read_text(),
                 lambda: f"no publishing line: {log.read_text()}")
        pause.release()
        assert proc.wait(timeout=120) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "\x1b[" not in text and "\r" not in text, repr(text)  # lines, no bars
    second = session.images / job_id / "ckpt-0002"
    hosts = sorted({p["host"] for p in manifests.read_manifest(second)["processes"]})
    written_bytes = sum(bytes_by_host(second, hosts).values())
    written = human_size(written_bytes)
    # the estimate: the previous checkpoint's images (its event's bytes)
    previous = sum(p["size"] for p in manifests.read_manifest(first)["processes"])
    lines = text.splitlines()
    [publishing] = [line for line in lines if "ckpt-0002 publishing" in line]
    assert publishing == (f"ckpt: job {job_id}: ckpt-0002 publishing: {written} "
                          f"of ~{human_size(max(previous, written_bytes))}"), publishing
    after = lines[lines.index(publishing) + 1:]
    assert re.fullmatch(rf"ckpt: job {job_id}: checkpoint {re.escape(str(second))} "
                        rf"\({re.escape(written)} in [0-9.]+ s\)", after[0]), after
    # outside Slurm scontrol fails, or ends by the SIGTERM that ends the job
    # (taken for a requeue of our own job): the line after says which
    assert any(f"job {job_id}: cannot requeue: scontrol requeue {job_id}" in line
               or line == f"ckpt: job {job_id}: requeued" for line in after), after
    assert lines.index(f"ckpt: job {job_id}: USR1: checkpoint and requeue") < lines.index(publishing)
