"""What a user watching a job sees, on real jobs: the event log, `ckpt
status` and `ckpt list` (text and --json against their schemas), progress
on a terminal (through a pseudo-terminal) and none without one, and the
shell completion of job ids and checkpoint directories."""
import json
import os
import pty
import re
import select
import socket
import subprocess
import time

import jsonschema
import pytest

from ckpt import manifest as manifests
from harness import REPO, Job, Pause

def approx(seconds):
    return pytest.approx(seconds, abs=1e-6)


SCHEMAS = REPO / "docs" / "schemas"
COUNTER = ["counter", "600", "10"]


def validator(name):
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def events_of(job_dir):
    lines = (job_dir / "events.jsonl").read_text().splitlines()
    check = validator("events")
    events = [json.loads(line) for line in lines]
    for event in events:
        check.validate(event)
    return events


def status_json(session, *args):
    document = json.loads(session.ckpt("status", *args, "--json").stdout)
    validator("status").validate(document)
    return document


def wait_status(session, job_id, timeout=60):
    deadline = time.monotonic() + timeout
    while "@" not in session.ckpt("status", job_id, check=False).stdout:
        assert time.monotonic() < deadline, f"job {job_id} never registered a process"
        time.sleep(0.05)


class Terminal:
    """A command on a pseudo-terminal: everything it wrote, as it comes."""

    def __init__(self, argv, env, cwd=None):
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd,
                                     env={**env, "TERM": "xterm", "COLUMNS": "160"})
        os.close(slave)
        self.seen = b""

    def read_until(self, words, timeout=60):
        """Until each of words was written (bytes), or the command ended."""
        deadline = time.monotonic() + timeout
        while not all(word in self.seen for word in words):
            assert time.monotonic() < deadline, f"never saw {words} in {self.seen[-2000:]!r}"
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:  # the command ended and closed its side
                    assert all(word in self.seen for word in words), self.seen[-2000:]
                    return

    def finish(self, timeout=60):
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None or select.select([self.master], [], [], 0)[0]:
            assert time.monotonic() < deadline, "the command did not end"
            try:
                chunk = os.read(self.master, 65536) if select.select(
                    [self.master], [], [], 0.1)[0] else b""
            except OSError:
                break
            if not chunk and self.proc.poll() is not None:
                break
            self.seen += chunk
        os.close(self.master)
        return self.proc.wait(timeout=timeout)


def test_event_log_status_and_list(session):
    job = Job(session, "watched", *COUNTER, launch_args=("--interval", "3600"))
    # a command of several lines stays one line of `ckpt list`
    script = "while :; do\n  sleep 1\ndone"
    other = Job(session, "two-lines", ["/bin/sh", "-c", script])
    job.wait_ready()
    wait_status(session, other.id)
    first = job.checkpoint()
    second = job.checkpoint()
    job_dir = session.images / job.id

    logged = events_of(job_dir)
    assert [(e["kind"], e["checkpoint"]) for e in logged] == [("checkpoint", 1), ("checkpoint", 2)]
    for event, path in zip(logged, (first, second)):
        manifest = manifests.read_manifest(path)
        assert event["path"] == str(path)
        assert event["bytes"] == sum(p["size"] for p in manifest["processes"])
        # seconds to the microsecond
        assert event["stopped_max_s"] == approx(max(p["stopped_ns"] for p in manifest["processes"]) / 1e9)
        assert event["hosts"] == {socket.gethostname(): {
            "processes": len(manifest["processes"]), "bytes": event["bytes"],
            "write_s": approx(max(p["write_ns"] for p in manifest["processes"]) / 1e9),
            "stopped_s": event["stopped_max_s"]}}
        assert {"SUSPEND", "WRITE", "RESUME", "PUBLISH"} <= set(event["phases"])

    document = status_json(session, job.id)
    [described] = document["jobs"]
    assert described["reachable"] and described["checkpoints_taken"] == 2
    assert described["last_checkpoint"]["checkpoint"] == 2
    assert described["last_checkpoint"]["path"] == str(second)
    assert described["last_checkpoint"]["bytes"] == logged[1]["bytes"]
    assert described["interval_s"] == 3600 and described["next_checkpoint"] is not None
    assert described["hosts"] == [socket.gethostname()]
    assert described["checkpoint_in_progress"] is None and described["last_failure"] is None

    text = session.ckpt("status", job.id).stdout
    assert "last:         ckpt-0002 at " in text and "next:         periodic at" in text, text
    # oldest first: the two started together, in either order
    listing = sorted(session.ckpt("list").stdout.splitlines(),
                     key=lambda line: not line.startswith(job.id + "\t"))
    assert [line.split("\t")[0] for line in listing] == [job.id, other.id], listing
    assert listing[1].endswith("/bin/sh -c 'while :; do\\n  sleep 1\\ndone'"), listing[1]
    fields = listing[0].split("\t")
    assert fields[2] == "2" and fields[3].startswith("ckpt-0002@"), fields
    every = json.loads(session.ckpt("list", "--json").stdout)
    validator("status").validate(every)
    by_id = {j["job_id"]: j for j in every["jobs"]}
    assert sorted(by_id) == sorted([job.id, other.id])
    assert by_id[other.id]["command"] == ["/bin/sh", "-c", script]

    inspect_a_checkpoint(session, job, second)

    # a failed restart is logged too: an image whose bytes were changed
    job.kill()
    other.kill()
    image = first / manifests.read_manifest(first)["processes"][0]["image"]
    with open(image, "r+b") as corrupt:
        corrupt.seek(image.stat().st_size // 2)
        byte = corrupt.read(1)
        corrupt.seek(-1, os.SEEK_CUR)
        corrupt.write(bytes([byte[0] ^ 0xFF]))
    for argv in (["restart", first], ["inspect", first]):
        refused = session.ckpt(*argv, check=False)
        assert refused.returncode in (1, 2) and refused.stderr.count("\n") == 1, refused.stderr
        assert "checksum mismatch" in refused.stderr and "Traceback" not in refused.stderr
    failed = events_of(job_dir)[-1]
    assert failed["kind"] == "restart_failed" and failed["checkpoint"] == 1, failed
    assert failed["path"] == str(first) and failed["error"]


def inspect_a_checkpoint(session, job, path):
    """`ckpt inspect` of a real checkpoint: the counter's process, its
    threads, memory regions and fds as the kernel showed them."""
    contents = json.loads(session.ckpt("inspect", path, "--json").stdout)
    manifest = manifests.read_manifest(path)
    assert contents["v"] == 1 and contents["checkpoint"] == manifest["checkpoint"]
    assert [p["pid"] for p in contents["processes"]] == [p["pid"] for p in manifest["processes"]]
    [counter] = [p for p in contents["processes"] if p["exe"].endswith("/counter")]
    assert counter["ppid"] == job.proc.pid and counter["pid"] in [t["tid"] for t in counter["threads"]]
    kinds = {region["kind"] for region in counter["memory"]}
    assert {"heap", "stack", "file"} <= kinds, kinds
    assert sum(region["saved"] for region in counter["memory"]) > 0
    [stdout] = [fd for fd in counter["fds"] if fd["fd"] == 1]
    assert stdout["path"] == str(job.out) and stdout["kind"] == "file", stdout
    detail = session.ckpt("inspect", path, "--pid", counter["pid"]).stdout
    assert f"process {counter['pid']} on " in detail and "[stack]" in detail, detail
    assert re.search(r"\n +1 file +O_WRONLY", detail) and str(job.out) in detail, detail


def test_progress_on_a_terminal_and_none_without(session):
    pause = Pause(session, "PUBLISH")
    session.extra_env.update(pause.env)
    job = Job(session, "progress", *COUNTER)
    job.wait_ready()
    piped = job.checkpoint()  # a pipe, not a terminal: the path alone
    quiet = session.ckpt("checkpoint", job.id)
    assert quiet.stderr == "" and quiet.stdout == str(piped.with_name("ckpt-0002")) + "\n"

    pause.arm()
    shown = Terminal(session.ckpt_argv("checkpoint", job.id), session.env(), session.work)
    pause.wait()
    # held before its publication: the images are written; the total is
    # the previous checkpoint's size
    shown.read_until([b"ckpt-0003 publishing"])
    assert re.search(rb"[0-9.]+/[0-9.]+ [KM]iB", shown.seen), shown.seen[-2000:]
    pause.release()
    assert shown.finish() == 0
    assert shown.seen.rstrip().endswith(str(session.images / job.id / "ckpt-0003").encode())

    # a restart held before RESUME shows its phase and the processes back
    last = job.checkpoint("--kill")
    job.proc.wait(timeout=60)
    count = len(manifests.read_manifest(last)["processes"])
    pause.arm()
    restarted = Terminal(session.ckpt_argv("restart", last),
                         {**session.env(), "CKPT_PAUSE_BEFORE": f"RESUME:{pause.path}"},
                         session.work)
    pause.wait()
    restarted.read_until([b"ckpt-0004 resuming the job", f"{count}/{count}".encode()])
    pause.release()
    job.hold.unlink(missing_ok=True)  # the restored counter runs to its end
    assert restarted.finish(timeout=120) == 0, restarted.seen[-2000:]
    assert "PASS" in job.output()
    kinds = [e["kind"] for e in events_of(session.images / job.id)]
    assert kinds == ["checkpoint"] * 4 + ["restart"]


def complete(session, words):
    """What bash completion offers for the last of words."""
    env = {**session.env(), "_CKPT_COMPLETE": "bash_complete",
           "COMP_WORDS": " ".join(words), "COMP_CWORD": str(len(words) - 1)}
    done = subprocess.run(session.ckpt_argv(), env=env, cwd=session.work,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return [line.split(",", 1)[1] for line in done.stdout.splitlines()]


def test_completion_of_job_ids_and_checkpoint_directories(session):
    job = Job(session, "completed-job", *COUNTER)
    job.wait_ready()
    path = job.checkpoint()
    assert complete(session, ["ckpt", "status", "comp"]) == [job.id]
    assert complete(session, ["ckpt", "checkpoint", ""]) == [job.id]
    offered = complete(session, ["ckpt", "restart", f"{session.images}/"])
    assert offered == [str(session.images / job.id), str(path)], offered
    script = subprocess.run(session.ckpt_argv(), env={**session.env(),
                            "_CKPT_COMPLETE": "bash_source"}, capture_output=True, text=True)
    assert "complete -o nosort -F _ckpt_completion ckpt" in script.stdout
    job.kill()
