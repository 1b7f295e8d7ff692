"""CLI behaviour: one-line errors, exit codes, and a launch/checkpoint/restart
round trip with the Python fake shim standing in for the native code."""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ckpt import manifest as m
from ckpt import paths
from ckpt.cli import main
from ckpt.image import bytes_xxh3
from tests.fakeshim import make_image
from ckpt.launch import check_program, job_environment

REPO = Path(__file__).resolve().parent.parent
HAVE_GCC = shutil.which("gcc") is not None


@pytest.fixture
def env(monkeypatch):
    """Private state dir and config for each test."""
    state = Path(tempfile.mkdtemp(prefix="ckst"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(state))
    monkeypatch.setenv("CKPT_CONFIG", str(state / "none.yaml"))
    for name in ("CKPT_DIR", "CKPT_INTERVAL", "CKPT_BARRIER_TIMEOUT", "CKPT_KEEP", "CKPT_NATIVE_DIR"):
        monkeypatch.delenv(name, raising=False)
    yield state
    shutil.rmtree(state, ignore_errors=True)


def invoke(*args):
    return CliRunner().invoke(main, list(args))


def one_line_error(result, words, code=1, prefix="ckpt: error: "):
    assert result.exit_code == code, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), result.output
    assert words in lines[0]
    assert "Traceback" not in result.output


def compile_c(tmp_path, name, source, *flags):
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    out = tmp_path / name
    subprocess.run(["gcc", *flags, "-o", str(out), str(src)], check=True)
    return out


def test_unknown_job(env):
    one_line_error(invoke("checkpoint", "nosuchjob"), "no running job 'nosuchjob'")
    one_line_error(invoke("kill", "nosuchjob"), "no running job")
    one_line_error(invoke("status", "nosuchjob"), "no running job")


def test_list_empty(env):
    result = invoke("list")
    assert result.exit_code == 0 and result.output == ""


def test_launch_missing_executable(env):
    one_line_error(invoke("launch", "--", "no-such-program-x"),
                   "cannot execute 'no-such-program-x': No such file or directory")


def test_launch_not_executable(env, tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("hello")
    one_line_error(invoke("launch", "--", str(path)), "Permission denied")


def test_launch_script_with_missing_interpreter(env, tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/no/such/shell\necho hi\n")
    script.chmod(0o755)
    one_line_error(invoke("launch", "--", str(script)), "interpreter /no/such/shell")


@pytest.mark.skipif(not HAVE_GCC, reason="needs gcc")
def test_launch_static_executable(env, tmp_path):
    static = compile_c(tmp_path, "static", "int main(void) { return 0; }\n", "-static")
    one_line_error(invoke("launch", "--", str(static)), "statically linked")


def test_dynamic_program_and_script_pass_preflight(tmp_path):
    assert check_program("sh")
    script = tmp_path / "ok.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    script.chmod(0o755)
    assert check_program(str(script)) == str(script)


def test_job_environment_prepends_the_shim():
    base = {"LD_PRELOAD": "/other.so", "CKPT_COORD": "/s.sock"}
    env = job_environment("/n/libckpt.so", base)
    assert env["LD_PRELOAD"] == "/n/libckpt.so:/other.so"
    assert env["CKPT_COORD"] == "/s.sock" and base["LD_PRELOAD"] == "/other.so"
    assert job_environment("/n/libckpt.so", {})["LD_PRELOAD"] == "/n/libckpt.so"


def test_invalid_job_id(env):
    result = invoke("launch", "--job-id", "../evil", "--", "true")
    one_line_error(result, "invalid job id", code=2)


def test_bad_config_file(env, tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text("interval: [\n")
    monkeypatch.setenv("CKPT_CONFIG", str(config))
    one_line_error(invoke("launch", "--", "true"), "bad config file")


def make_checkpoint(job_dir, number=1, payload=b"z" * 3000):
    directory = paths.checkpoint_dir(job_dir, number)
    directory.mkdir(parents=True)
    data = make_image(7, payload)
    (directory / "proc-7.img").write_bytes(data)
    proc = {"pid": 7, "host": "h", "image": "proc-7.img", "size": len(data),
            "xxh3": bytes_xxh3(data)}
    m.write_manifest(directory, m.build_manifest(job_id=job_dir.name, number=number, command=["app"],
                                                 processes=[proc], start_ns=1, end_ns=2))
    m.update_latest(job_dir, directory.name)
    return directory


def test_restart_refuses_corrupt_image_before_running_anything(env, tmp_path):
    checkpoint = make_checkpoint(tmp_path / "job9")
    image = checkpoint / "proc-7.img"
    image.write_bytes(image.read_bytes()[:-1] + b"!")
    # the real ckpt-restart checks the XXH3 before it changes anything
    result = ckpt("restart", str(tmp_path / "job9"), environ=dict(os.environ))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckpt-restart: "), result.stderr
    assert "checksum mismatch" in lines[0]


def test_restart_refuses_missing_image(env, tmp_path):
    checkpoint = make_checkpoint(tmp_path / "job9")
    (checkpoint / "proc-7.img").unlink()
    one_line_error(invoke("restart", str(checkpoint)), "missing")


def test_restart_of_nothing(env, tmp_path):
    one_line_error(invoke("restart", str(tmp_path)), "no checkpoint here")
    one_line_error(invoke("restart", str(tmp_path / "nope")), "no such file")


def test_images_lists_and_flags_corruption(env, tmp_path):
    job = tmp_path / "job9"
    make_checkpoint(job, 1)
    bad = make_checkpoint(job, 2)
    with open(bad / "proc-7.img", "r+b") as image:
        image.truncate(100)
    result = invoke("images", str(job))
    assert result.exit_code == 1, result.output     # one of them is corrupt
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("ckpt-0001") and lines[0].endswith("\tok")
    assert lines[1].startswith("ckpt-0002") and "CORRUPT: " in lines[1] and "truncated" in lines[1]


# ---- round trip through real processes, with the fake shim -------------------

FAKE_RESTART = """#!/bin/sh
# stands in for ckpt-restart: --coord S --job-id ID --xxh3 H IMAGE
coord=$2
for last; do :; done
pid=$(basename "$last" .img); pid=${pid#proc-}
CKPT_COORD=$coord FAKESHIM_RESTORED=1 FAKESHIM_PID=$pid exec "$PYTHON" -m tests.fakeshim
"""


@pytest.fixture
def fake_native(tmp_path):
    if not HAVE_GCC:
        pytest.skip("needs gcc")
    native = tmp_path / "native"
    native.mkdir()
    compile_c(native, "libckpt.so", "int ckpt_fake_shim;\n", "-shared", "-fPIC")
    (native / "include").symlink_to(REPO / "native" / "include")
    restart = native / "ckpt-restart"
    restart.write_text(FAKE_RESTART)
    restart.chmod(0o755)
    return native


def ckpt(*args, environ, **kw):
    return subprocess.run([sys.executable, "-m", "ckpt", *args], env=environ, cwd=str(REPO),
                          capture_output=True, text=True, timeout=60, **kw)


def wait_for_job(job_id, environ):
    for _ in range(200):
        status = ckpt("status", job_id, environ=environ)
        if status.returncode == 0 and "@" in status.stdout:  # a process registered
            return status.stdout
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never registered")


def test_launch_checkpoint_kill_restart_round_trip(env, tmp_path, fake_native):
    # the fake ckpt-restart starts a new Python process in the old one's
    # place: no restore, so nothing of the old one to verify
    environ = dict(os.environ, CKPT_NATIVE_DIR=str(fake_native), PYTHON=sys.executable,
                   PYTHONPATH=str(REPO), CKPT_VERIFY="off")
    images = tmp_path / "images"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ckpt", "launch", "--job-id", "rt1", "--ckpt-dir", str(images),
         "--", sys.executable, "-m", "tests.fakeshim"],
        env=environ, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_job("rt1", environ)
        listing = ckpt("list", environ=environ).stdout
        assert listing.startswith("rt1\t")
        first = ckpt("checkpoint", "rt1", environ=environ)
        assert first.returncode == 0, first.stderr
        assert first.stdout.strip().splitlines()[-1] == str(images / "rt1" / "ckpt-0001")
        killed = ckpt("checkpoint", "rt1", "--kill", environ=environ)
        assert killed.stdout.strip().endswith("ckpt-0002")
        out, err = launcher.communicate(timeout=30)
    finally:
        launcher.kill()
    assert launcher.returncode == 137
    assert err.startswith("ckpt: job rt1")
    assert out == ""  # nothing on the job's stdout

    restarted = subprocess.Popen([sys.executable, "-m", "ckpt", "restart", str(images / "rt1")],
                                 env=environ, cwd=str(REPO), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        wait_for_job("rt1", environ)
        third = ckpt("checkpoint", "rt1", environ=environ)
        assert third.stdout.strip().endswith("ckpt-0003"), third.stderr
        assert m.read_manifest(images / "rt1" / "ckpt-0003")["restarted_from"] == 2
        assert ckpt("kill", "rt1", environ=environ).returncode == 0
        restarted.communicate(timeout=30)
    finally:
        restarted.kill()
    assert restarted.returncode == 137
    assert ckpt("list", environ=environ).stdout == ""


def native_env(fake_native):
    return dict(os.environ, CKPT_NATIVE_DIR=str(fake_native), PYTHON=sys.executable,
                PYTHONPATH=str(REPO))


def test_launch_exits_with_the_command_status(env, tmp_path, fake_native):
    result = ckpt("launch", "--ckpt-dir", str(tmp_path), "--", "sh", "-c",
                  'echo "$CKPT_JOB_ID $LD_PRELOAD"; exit 3', environ=native_env(fake_native))
    assert result.returncode == 3
    job_id, preload = result.stdout.split()
    assert result.stderr.startswith(f"ckpt: job {job_id}")
    assert preload == str(fake_native / "libckpt.so")


def test_launch_forwards_sigterm(env, tmp_path, fake_native):
    launcher = subprocess.Popen([sys.executable, "-m", "ckpt", "launch", "--job-id", "sig",
                                 "--ckpt-dir", str(tmp_path), "--", "sleep", "30"], env=native_env(fake_native), cwd=str(REPO),
                                stderr=subprocess.PIPE)
    for _ in range(200):
        if ckpt("list", environ=native_env(fake_native)).stdout.startswith("sig\t"):
            break
        time.sleep(0.05)
    launcher.terminate()
    launcher.communicate(timeout=30)
    assert launcher.returncode == 128 + 15


def test_periodic_checkpoints(env, tmp_path, fake_native):
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ckpt", "launch", "--job-id", "per", "--ckpt-dir", str(tmp_path),
         "--interval", "0.2", "--", sys.executable, "-m", "tests.fakeshim"],
        env=native_env(fake_native), cwd=str(REPO), stderr=subprocess.PIPE)
    try:
        for _ in range(200):
            if len(m.published_checkpoints(tmp_path / "per")) >= 2:
                break
            time.sleep(0.05)
        assert ckpt("kill", "per", environ=native_env(fake_native)).returncode == 0
        launcher.communicate(timeout=30)
    finally:
        launcher.kill()
    assert len(m.published_checkpoints(tmp_path / "per")) >= 2


def test_restart_reports_an_early_ckpt_restart_failure(env, tmp_path, fake_native):
    (fake_native / "ckpt-restart").write_text(
        "#!/bin/sh\necho 'ckpt-restart: cannot enter a new user namespace' >&2\nexit 2\n")
    make_checkpoint(tmp_path / "job9")
    result = ckpt("restart", str(tmp_path / "job9"), environ=native_env(fake_native))
    assert result.returncode == 2
    # ckpt-restart's own line is the one error line
    assert result.stderr.splitlines() == ["ckpt-restart: cannot enter a new user namespace"]
    assert "Traceback" not in result.stderr


def test_host_slots_forms_and_too_few_slots():
    from ckpt.errors import CkptError
    from ckpt.restart import check_slots, host_spec
    assert host_spec(["h3"], "f") == ("h3", None)
    assert host_spec(["h3:2"], "f") == ("h3", 2)
    assert host_spec(["h3", "slots=4", "max_slots=8"], "f") == ("h3", 4)
    for bad in (["h3:x"], ["h3", "slots=0"], [":2"]):
        with pytest.raises(CkptError, match="f, line 2: bad slot count") as info:
            host_spec(bad, "f, line 2")
        assert info.value.exit_code == 2
    manifest = {"processes": [{"host": "a"}, {"host": "a"}, {"host": "b"}]}
    check_slots(manifest, {"a": "x", "b": "y"}, {"x": 2, "y": 1})
    with pytest.raises(CkptError, match="host x has 1 slots; the checkpoint has 2 processes on a"):
        check_slots(manifest, {"a": "x", "b": "y"}, {"x": 1})


def test_launch_and_slurm_run_take_the_same_options():
    from ckpt import cli
    params = lambda command: [p.name for p in command.params]
    assert params(cli.launch) == ["job_id"] + params(cli.slurm_run)
    assert "--stage-dir" in invoke("slurm", "run", "--help").output


def test_launch_help_says_the_configs_defaults():
    from ckpt.config import DEFAULTS
    assert DEFAULTS["compress"] == "none"
    text = " ".join(invoke("launch", "--help").output.split())
    assert "default: none" in text and "(default: forked)" in text and "(default 8)" in text


def test_launch_options_reach_the_settings(monkeypatch, tmp_path):
    from ckpt import launch as launch_module
    seen = {}
    monkeypatch.setattr(launch_module, "launch",
                        lambda command, config, job_id: seen.update(config=config, job=job_id) or 0)
    result = invoke("launch", "--job-id", "j1", "--ckpt-dir", str(tmp_path), "--in-place",
                    "--compress", "zstd", "--incremental", "--full-every", "3", "--keep", "2",
                    "--", "app", "--keep", "x")
    assert result.exit_code == 0, result.output
    config = seen["config"]
    assert seen["job"] == "j1" and config.ckpt_dir == tmp_path and config.keep == 2
    assert (config.forked_write, config.compress, config.incremental, config.full_every) == (
        False, "zstd", True, 3)
