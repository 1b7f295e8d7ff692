"""How `ckpt restart` starts other hosts' ckpt-restart: ssh or srun, and
its one-line refusals of srun where srun cannot reach (Slurm's real
scontrol expands the allocation's node list)."""
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from ckpt.cli import main
from ckpt.config import load_config
from ckpt.errors import CkptError
from ckpt.remote_start import over_srun, over_ssh, remote_starter
from test_cli import make_checkpoint

needs_slurm = pytest.mark.skipif(shutil.which("scontrol") is None, reason="no scontrol")


@pytest.fixture
def allocation(tmp_path):
    """The environment of a Slurm allocation of h1 and h2 (a config of
    its own: scontrol expands node lists without a controller)."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\n")
    return {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "h[1-2]", "SLURM_CONF": str(conf),
            "PATH": os.environ["PATH"]}


def test_auto_is_ssh_outside_an_allocation_and_srun_inside():
    assert remote_starter("auto", ["h2"], {}) is over_ssh
    assert remote_starter("ssh", ["h2"], {"SLURM_JOB_ID": "42"}) is over_ssh
    # nothing to start elsewhere: no allocation needed, whatever the setting
    assert remote_starter("srun", [], {}) is over_ssh


@needs_slurm
def test_srun_inside_the_allocation_on_its_nodes(allocation):
    assert remote_starter("auto", ["h2"], allocation) is over_srun
    assert remote_starter("srun", ["h1", "h2"], allocation) is over_srun


def test_srun_outside_an_allocation_is_refused():
    with pytest.raises(CkptError, match="not inside a Slurm allocation") as info:
        remote_starter("srun", ["h2"], {})
    assert info.value.exit_code == 2


@needs_slurm
@pytest.mark.parametrize("setting", ["auto", "srun"])
def test_srun_for_a_node_outside_the_allocation_is_refused(allocation, setting):
    with pytest.raises(CkptError, match=r"srun cannot start the restart on h3: not a node of "
                                        r"Slurm job 42 \(h\[1-2\]\)") as info:
        remote_starter(setting, ["h2", "h3"], allocation)
    assert info.value.exit_code == 2


def test_srun_step_runs_the_restart_under_the_agent_on_that_node():
    argv, env = over_srun("h2", ["ckpt-restart", "a.img"], {"CKPT_JOB_ID": "j"})
    assert argv[:6] == ["srun", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=h2",
                        "--input=none"]
    assert argv[-4:] == ["--run", "--", "ckpt-restart", "a.img"] and env == {"CKPT_JOB_ID": "j"}


def test_the_setting_from_flag_env_and_its_bad_values(monkeypatch, tmp_path):
    monkeypatch.setenv("CKPT_CONFIG", str(tmp_path / "none.yaml"))
    monkeypatch.delenv("CKPT_LAUNCHER", raising=False)
    assert load_config().launcher == "auto"
    assert load_config(environ={"CKPT_LAUNCHER": "SSH",
                                "CKPT_CONFIG": str(tmp_path / "none.yaml")}).launcher == "ssh"
    assert load_config(launcher="srun").launcher == "srun"
    with pytest.raises(CkptError, match="CKPT_LAUNCHER: launcher must be auto, ssh or srun"):
        load_config(environ={"CKPT_LAUNCHER": "rsh", "CKPT_CONFIG": str(tmp_path / "n.yaml")})


@pytest.fixture
def cli_env(monkeypatch):
    state = Path(tempfile.mkdtemp(prefix="ckrs"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(state))
    monkeypatch.setenv("CKPT_CONFIG", str(state / "none.yaml"))
    for name in ("CKPT_LAUNCHER", "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    yield state
    shutil.rmtree(state, ignore_errors=True)


def one_line(result):
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "Traceback" not in result.output
    return lines[0]


def test_restart_with_srun_outside_an_allocation_says_so_in_one_line(cli_env, tmp_path):
    make_checkpoint(tmp_path / "job9")
    line = one_line(CliRunner().invoke(main, ["restart", str(tmp_path / "job9"),
                                              "--hosts", "h3", "--launcher", "srun"]))
    assert line.startswith("ckpt: error: --launcher srun: not inside a Slurm allocation"), line


@needs_slurm
def test_restart_inside_an_allocation_onto_a_node_outside_it_says_so_in_one_line(
        cli_env, tmp_path, allocation, monkeypatch):
    for name, value in allocation.items():
        monkeypatch.setenv(name, value)
    make_checkpoint(tmp_path / "job9")
    line = one_line(CliRunner().invoke(main, ["restart", str(tmp_path / "job9"),
                                              "--hosts", "h3"]))
    assert "srun cannot start the restart on h3: not a node of Slurm job 42" in line, line
    assert "--launcher ssh" in line
