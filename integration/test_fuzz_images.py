"""Fuzzed checkpoints: a real checkpoint of a running program, mutated
(integration/image_fuzz.py) a thousand times and more, each mutant through
`ckpt images`, the restart's verification and, when that accepts it,
ckpt-restart itself.  Each must end in one clear line and a non-zero exit
(or restore, when the change is harmless), never a traceback, a signal, a
hang or a restored process left behind.  The suite runs seed 16 (the one
that found a hang); CKPT_FUZZ_SEED=random draws a new seed, and `make fuzz`
runs 20,000 mutants of a new one (a failure names its seed);
CKPT_FUZZ_SEED=N repeats a run, CKPT_FUZZ_MUTANTS sets how many,
CKPT_FUZZ_REPORT names a file for every finding.

Also: a manifest or image that points outside its checkpoint directory
is refused, named in one line."""
import json
import os
import random
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ckpt.errors import CkptError
from ckpt.image import verify_checkpoint
from ckpt.manifest import read_manifest, resolve_checkpoint
from ckpt.native import restart_binary
from ckpt.restart import restart_command
from cluster import kill_pids
from harness import APPS, Job, reap_orphans, restart_and_finish
from image_fuzz import Fuzzer, write_mutant

_SEED = os.environ.get("CKPT_FUZZ_SEED") or "16"
SEED = random.SystemRandom().randrange(1 << 32) if _SEED == "random" else int(_SEED)
MUTANTS = int(os.environ.get("CKPT_FUZZ_MUTANTS", "1200"))
BATCH = 50                 # mutants per `ckpt images JOB_DIR`
CLI_RESTARTS = 40          # of them also through the whole `ckpt restart`
RESTART_SECONDS = 20       # ckpt-restart refuses or restores within this
COUNTER = ["counter", "30", "10"]


WORK = {}   # the fuzzed job's working directory: its processes' cwd


def leftover_processes():
    """Restored copies of the fuzzed job still running, by their cwd (other
    tests' programs run elsewhere) and exe: the counter's, or ckpt-restart's
    while a process is still being restored (it takes the counter's exe
    late: seen only as the next mutant's leftover otherwise).  Called once
    the restart it follows has ended."""
    exes = (str(APPS / "counter"), str(restart_binary().resolve()))
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (os.readlink(entry / "exe") in exes
                        and os.readlink(entry / "cwd") == WORK.get("cwd")):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def kill_leftovers(grace=10.0):
    """Restored processes still there after `grace` seconds (a pid
    namespace goes down asynchronously once its ckpt-restart is gone: on a
    loaded CI machine once more than 2 s), killed so that one finding does
    not spill into the next mutant; each as "pid (state, pid namespace)"."""
    deadline = time.monotonic() + grace
    while leftover_processes() and time.monotonic() < deadline:
        reap_orphans()
        time.sleep(0.01)
    pids = leftover_processes()
    described = [_described(pid) for pid in pids]
    kill_pids(pids)
    deadline = time.monotonic() + 10
    while leftover_processes() and time.monotonic() < deadline:
        reap_orphans()
        time.sleep(0.01)
    reap_orphans()
    return described


def _described(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return f"{pid} ({state}, {os.readlink(f'/proc/{pid}/ns/pid')})"
    except (OSError, IndexError):
        return f"{pid} (gone)"


@pytest.fixture
def checkpoint(session):
    """(checkpoint dir of the counter, just after READY, killed; its job)"""
    WORK["cwd"] = str(session.work)
    job = Job(session, "fuzzed", *COUNTER)
    job.wait_ready()
    path = job.checkpoint("--kill")
    job.wait()
    yield path, job
    kill_leftovers()


def one_line_error(stderr, prefixes=("ckpt: error:", "ckpt-restart:")):
    """The error line, or why stderr is not one clear line."""
    lines = [line for line in stderr.splitlines()
             if line.strip() and not line.startswith("ckpt: warning:")
             and " ms" not in line[-4:]]     # CKPT_RESTART_TIMING's marks
    if "Traceback" in stderr or "internal error" in stderr:
        return None, f"traceback or internal error: {stderr.strip()[-300:]}"
    if len(lines) != 1 or not lines[0].startswith(prefixes):
        return None, f"not one error line: {stderr.strip()[-300:]!r}"
    return lines[0], None


def restart_verification(directory):
    """What `ckpt restart` checks before it starts anything: None if it
    accepts the checkpoint, else the message."""
    try:
        verify_checkpoint(resolve_checkpoint(directory), checksum=False)
    except CkptError as exc:
        return exc.message
    return None


def run_restart_binary(directory, work, env):
    """ckpt-restart on the mutant, without a coordinator: ('refused', line),
    ('restored', None) once its memory is back, or ('bad', why)."""
    manifest = read_manifest(directory)     # as `ckpt restart` reads it
    images = [(directory / p["image"], p["xxh3"]) for p in manifest["processes"]]
    argv = restart_command(restart_binary(), str(work / "no-coordinator"), "fuzzed", images)
    proc = subprocess.Popen(argv, cwd=work, env=dict(env, CKPT_RESTART_TIMING="1"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    err, deadline, restored = b"", time.monotonic() + RESTART_SECONDS, False
    while not restored and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            chunk = os.read(proc.stderr.fileno(), 65536)
            if not chunk:       # stderr closed: it exits now, or it hangs
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                break
            err += chunk
            restored = b"memory restored" in err
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
        return ("restored", None) if restored else ("bad", f"hang: {err.decode()[-300:]!r}")
    proc.wait()
    proc.stderr.close()
    text = err.decode(errors="replace")
    if proc.returncode < 0:
        return "bad", f"ckpt-restart killed by signal {-proc.returncode}: {text[-300:]!r}"
    if restored:
        return "restored", None
    if proc.returncode == 0:
        return "bad", "ckpt-restart exited 0 without restoring"
    line, why = one_line_error(text, ("ckpt-restart:",))
    return ("refused", line) if line else ("bad", why)


def check_images_listing(proc, names):
    """`ckpt images JOB_DIR`: a line per checkpoint, ok or CORRUPT with the reason."""
    problems, verdicts = [], {}
    if "Traceback" in proc.stderr or proc.stderr.strip():
        problems.append(f"ckpt images wrote to stderr: {proc.stderr.strip()[-300:]}")
    for line in proc.stdout.splitlines():
        name, _size, _when, _memory, verdict = line.split("\t", 4)
        verdicts[name] = verdict
    if set(verdicts) != set(names):
        problems.append(f"ckpt images listed {sorted(verdicts)} for {sorted(names)}")
    for name, verdict in verdicts.items():
        if verdict != "ok" and (not verdict.startswith("CORRUPT: ") or "internal error" in verdict):
            problems.append(f"{name}: {verdict}")
    corrupt = any(v != "ok" for v in verdicts.values())
    if proc.returncode != (1 if corrupt else 0):
        problems.append(f"ckpt images exited {proc.returncode} (corrupt: {corrupt})")
    return verdicts, problems


def test_fuzzed_checkpoints_fail_cleanly(session, checkpoint, tmp_path):
    original, _job = checkpoint
    rng = random.Random(SEED)
    print(f"fuzz seed {SEED} (CKPT_FUZZ_SEED to repeat), {MUTANTS} mutants")
    fuzzer = Fuzzer(original, rng)
    outside = original / fuzzer.image_name
    failures, tally, cli_left = [], {}, CLI_RESTARTS
    for first in range(0, MUTANTS, BATCH):
        job_dir = tmp_path / f"batch-{first}"
        job_dir.mkdir()
        mutants = {}
        for i in range(min(BATCH, MUTANTS - first)):
            name = f"ckpt-{i + 1:04d}"
            mutants[name] = fuzzer.mutant()
            write_mutant(mutants[name], job_dir / name, outside)
        listing = session.ckpt("images", job_dir, check=False, timeout=300)
        verdicts, problems = check_images_listing(listing, mutants)
        failures += [f"batch {first}: {p}" for p in problems]
        for name, mutant in mutants.items():
            where = f"mutant {first + int(name[5:])} ({'; '.join(mutant.what)})"
            try:
                refusal = restart_verification(job_dir / name)
            except Exception as exc:        # what `ckpt restart` shows as an internal error
                failures.append(f"{where}: restart verification raised {exc!r}")
                continue
            if refusal is not None:
                if "\n" in refusal:
                    failures.append(f"{where}: message of several lines: {refusal!r}")
                outcome = "refused by ckpt"
            else:
                if verdicts.get(name, "ok") != "ok" and "checksum" not in verdicts[name]:
                    failures.append(f"{where}: ckpt images says {verdicts[name]}, restart accepts")
                result, detail = run_restart_binary(job_dir / name, session.work, session.env())
                if result == "bad":
                    failures.append(f"{where}: {detail}")
                if leftover := kill_leftovers():
                    failures.append(f"{where}: ckpt-restart killed, {leftover} left running")
                outcome = f"{result} by ckpt-restart"
                if cli_left and (result == "restored" or rng.random() < 0.1):
                    cli_left -= 1
                    failures += [f"{where}: ckpt restart: {p}"
                                 for p in restart_whole(session, job_dir / name)]
                    if leftover := kill_leftovers():
                        failures.append(f"{where}: after ckpt restart, {leftover} left running")
            tally[outcome] = tally.get(outcome, 0) + 1
            if leftover := kill_leftovers():
                failures.append(f"{where}: restored processes {leftover} left running")
        shutil.rmtree(job_dir)
    print("outcomes:", tally)
    if os.environ.get("CKPT_FUZZ_REPORT"):     # every finding, for a longer run
        Path(os.environ["CKPT_FUZZ_REPORT"]).write_text("\n".join(failures) + "\n")
    assert sum(tally.values()) == MUTANTS
    assert not failures, (f"fuzz seed {SEED} (CKPT_FUZZ_SEED={SEED} repeats it): {len(failures)} "
                          f"of {MUTANTS} mutants misbehaved:\n" + "\n".join(failures[:30]))


def restart_whole(session, directory):
    """`ckpt restart` of a mutant that ckpt-restart accepts or refuses:
    either the job runs to its end, or one line and a non-zero exit."""
    try:
        proc = subprocess.run(session.ckpt_argv("restart", directory), cwd=session.work,
                              env=session.env(), capture_output=True, text=True,
                              errors="replace", timeout=120)
    except subprocess.TimeoutExpired:
        return ["hang"]
    finally:
        reap_orphans()
    if proc.returncode == 0:
        return []
    if "Traceback" in proc.stderr:
        return [f"traceback: {proc.stderr[-300:]}"]
    # the program itself may fail on a harmless-looking change (FAIL line, its status)
    if "restart failed" in proc.stderr or "error" in proc.stderr:
        _line, why = one_line_error(proc.stderr)
        return [why] if why else []
    return []


# ---- pointing outside the checkpoint directory ------------------------------

def _manifest(path):
    return json.loads((path / "manifest.yaml").read_text())


def _write_manifest(path, manifest):
    (path / "manifest.yaml").write_text(json.dumps(manifest))


@pytest.mark.parametrize("name", ["../ckpt-0001/IMG", "/ABS/IMG", "sub/IMG", "..", ".IMG"])
def test_image_name_outside_the_directory_is_refused(session, checkpoint, name):
    original, _job = checkpoint
    copy = original.parent / "ckpt-0002"
    shutil.copytree(original, copy)
    manifest = _manifest(copy)
    image = manifest["processes"][0]["image"]
    manifest["processes"][0]["image"] = name.replace("IMG", image).replace("/ABS", str(original))
    _write_manifest(copy, manifest)
    for command in ("restart", "images"):
        proc = session.ckpt(command, copy, check=False)
        assert proc.returncode != 0
        text = proc.stderr if command == "restart" else proc.stdout
        assert "bad image name" in text and "Traceback" not in proc.stderr, text
    line, why = one_line_error(session.ckpt("restart", copy, check=False).stderr)
    assert line, why


def test_image_symlink_out_of_the_directory_is_refused(session, checkpoint):
    original, job = checkpoint
    copy = original.parent / "ckpt-0002"
    shutil.copytree(original, copy)
    image = _manifest(copy)["processes"][0]["image"]
    elsewhere = session.root / "elsewhere.img"
    shutil.copy(copy / image, elsewhere)
    (copy / image).unlink()
    os.symlink(elsewhere, copy / image)
    proc = session.ckpt("restart", copy, check=False)
    line, why = one_line_error(proc.stderr)
    assert line and "symbolic link" in line, why or line
    assert proc.returncode != 0
    listing = session.ckpt("images", copy, check=False)
    assert listing.returncode == 1 and "symbolic link" in listing.stdout
    # ckpt-restart itself will not follow one either
    argv = restart_command(restart_binary(), str(session.work / "none"), "fuzzed",
                           [(copy / image, _manifest(copy)["processes"][0]["xxh3"])])
    direct = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert direct.returncode == 2 and "symbolic link" in direct.stderr, direct.stderr
    assert not kill_leftovers()
    # the same image, not a link, still restarts to the right result
    (copy / image).unlink()
    shutil.move(elsewhere, copy / image)
    assert "PASS" in restart_and_finish(session, copy, job)


def test_manifest_symlink_is_refused(session, checkpoint):
    original, _job = checkpoint
    copy = original.parent / "ckpt-0002"
    shutil.copytree(original, copy)
    elsewhere = session.root / "manifest.yaml"
    shutil.move(copy / "manifest.yaml", elsewhere)
    os.symlink(elsewhere, copy / "manifest.yaml")
    line, why = one_line_error(session.ckpt("restart", copy, check=False).stderr)
    assert line and "symbolic link" in line, why or line


@pytest.mark.parametrize("which", ["manifest", "image"])
def test_fifo_in_place_of_a_file_is_refused_not_waited_on(session, checkpoint, which):
    original, _job = checkpoint
    copy = original.parent / "ckpt-0002"
    shutil.copytree(original, copy)
    target = copy / ("manifest.yaml" if which == "manifest" else _manifest(copy)["processes"][0]["image"])
    target.unlink()
    os.mkfifo(target)
    for command in ("restart", "images"):
        proc = session.ckpt(command, copy, check=False, timeout=60)   # a hang fails here
        assert proc.returncode != 0
        text = proc.stderr if command == "restart" else proc.stdout
        assert "not a regular file" in text and "Traceback" not in proc.stderr, text
