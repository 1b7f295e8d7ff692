"""ckpt slurm run outside a job, and its reading of Slurm's variables."""

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from ckpt import slurm
from ckpt.cli import main
from ckpt.errors import CkptError


def test_outside_a_slurm_job_is_one_clear_line(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    result = CliRunner().invoke(main, ["slurm", "run", "--", "true"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "ckpt: error: ckpt slurm run: not inside a Slurm job (no SLURM_JOB_ID); "
        "run it as the last command of an sbatch script"]


def test_restart_count_reads_slurms_variable():
    assert slurm.restart_count({}) == 0
    assert slurm.restart_count({"SLURM_RESTART_COUNT": "2"}) == 2
    assert slurm.restart_count({"SLURM_RESTART_COUNT": "x"}) == 0


def test_no_nodelist_is_an_error():
    with pytest.raises(CkptError, match="SLURM_JOB_NODELIST"):
        slurm.allocation_hosts({})


def test_latest_checkpoint_of_a_job_without_one(tmp_path):
    assert slurm.latest_checkpoint(tmp_path / "missing") is None
    (tmp_path / "42").mkdir()
    assert slurm.latest_checkpoint(tmp_path / "42") is None


def test_the_example_batch_script_without_a_command_says_how_to_use_it():
    script = Path(__file__).resolve().parent.parent / "examples" / "slurm" / "ckpt-job.sh"
    r = subprocess.run([str(script)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [f"usage: sbatch {script} COMMAND [ARGS...]"]
