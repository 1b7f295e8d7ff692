from pathlib import Path

import pytest

from ckpt.config import load_config
from ckpt.errors import CkptError


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    monkeypatch.setenv("CKPT_CONFIG", str(path))
    for name in ("CKPT_DIR", "CKPT_INTERVAL", "CKPT_BARRIER_TIMEOUT", "CKPT_KEEP",
                 "CKPT_FORKED_WRITE", "CKPT_COMPRESS"):
        monkeypatch.delenv(name, raising=False)
    return path


def test_defaults_without_file(config_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config()
    assert config.ckpt_dir == tmp_path / "ckpt-images"
    assert config.interval == 0
    assert config.barrier_timeout == 120
    assert config.keep == 0
    assert config.forked_write  # the job runs on while its images are written
    assert config.compress == "none"  # restart speed first; zstd and auto on request


def test_in_place_from_file_env_or_flag(config_file, monkeypatch):
    config_file.write_text("forked_write: no\n")
    assert not load_config().forked_write
    monkeypatch.setenv("CKPT_FORKED_WRITE", "yes")
    assert load_config().forked_write
    assert not load_config(forked_write=False).forked_write


def test_compress_from_file_env_or_flag(config_file, monkeypatch):
    config_file.write_text("compress: auto\n")
    assert load_config().compress == "auto"
    monkeypatch.setenv("CKPT_COMPRESS", "ZSTD")
    assert load_config().compress == "zstd"
    assert load_config(compress="none").compress == "none"
    monkeypatch.setenv("CKPT_COMPRESS", "gzip")
    with pytest.raises(CkptError, match="CKPT_COMPRESS: compress must be none, zstd or auto"):
        load_config()


def test_file_then_env_then_flags(config_file, monkeypatch):
    config_file.write_text("ckpt_dir: /from/file\ninterval: 10\nbarrier_timeout: 30\nkeep: 3\n")
    config = load_config()
    assert (config.ckpt_dir, config.interval, config.barrier_timeout, config.keep) == (
        Path("/from/file"), 10, 30, 3)

    monkeypatch.setenv("CKPT_DIR", "/from/env")
    monkeypatch.setenv("CKPT_INTERVAL", "20")
    config = load_config()
    assert config.ckpt_dir == Path("/from/env")
    assert config.interval == 20
    assert config.barrier_timeout == 30  # still from the file

    config = load_config(ckpt_dir="/from/flag", interval=5.0)
    assert config.ckpt_dir == Path("/from/flag")
    assert config.interval == 5
    assert config.keep == 3


def test_incremental_settings(config_file, monkeypatch):
    assert (load_config().incremental, load_config().full_every) == (False, 8)
    config_file.write_text("incremental: yes\nfull_every: 4\n")
    assert (load_config().incremental, load_config().full_every) == (True, 4)
    monkeypatch.setenv("CKPT_FULL_EVERY", "2")
    assert load_config().full_every == 2
    assert load_config(incremental=False).incremental is False


def test_stage_dir(config_file, monkeypatch, tmp_path):
    assert load_config().stage_dir is None
    config_file.write_text("stage_dir: ~/stage\n")
    assert load_config().stage_dir == Path.home() / "stage"
    monkeypatch.setenv("CKPT_STAGE_DIR", "/dev/shm/s")
    assert load_config().stage_dir == Path("/dev/shm/s")
    assert load_config(stage_dir=str(tmp_path)).stage_dir == tmp_path
    with pytest.raises(CkptError, match="cannot be the checkpoint directory"):
        load_config(stage_dir=str(tmp_path), ckpt_dir=str(tmp_path))


def test_keep_all(config_file):
    config_file.write_text("keep: all\n")
    assert load_config().keep == 0


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_keep_of_less_than_one_is_refused(config_file, value):
    with pytest.raises(CkptError, match="keep must"):
        load_config(keep=value)


@pytest.mark.parametrize("text, words", [
    ("interval: [1, 2\n", "line"),
    ("- a\n- b\n", "mapping"),
    ("colour: blue\n", "unknown setting"),
    ("barrier_timeout: 0\n", "positive"),
    ("interval: soon\n", "number"),
    ("keep: -1\n", "at least 1"),
    ("full_every: 0\n", "between 1 and 64"),
    ("full_every: 65\n", "between 1 and 64"),
    ("incremental: maybe\n", "yes or no"),
    ("stage_dir: [a]\n", "must be a path"),
])
def test_bad_file_is_one_line_error(config_file, text, words):
    config_file.write_text(text)
    with pytest.raises(CkptError) as err:
        load_config()
    assert words in err.value.message
    assert str(config_file) in err.value.message
    assert "\n" not in err.value.message


def test_bad_env_value(config_file, monkeypatch):
    monkeypatch.setenv("CKPT_BARRIER_TIMEOUT", "-3")
    with pytest.raises(CkptError, match="CKPT_BARRIER_TIMEOUT"):
        load_config()


def test_lazy_from_file_env_or_flag(config_file, monkeypatch):
    monkeypatch.delenv("CKPT_LAZY", raising=False)
    assert not load_config().lazy  # a plain restore unless asked
    config_file.write_text("lazy: yes\n")
    assert load_config().lazy
    monkeypatch.setenv("CKPT_LAZY", "0")
    assert not load_config().lazy
    assert load_config(lazy=True).lazy
    monkeypatch.setenv("CKPT_LAZY", "sometimes")
    with pytest.raises(CkptError, match="CKPT_LAZY: lazy must be yes or no"):
        load_config()


def test_lazy_restart_command_and_refusals():
    from ckpt.restart import check_lazy, restart_command
    from ckpt.jobs import this_host
    argv = restart_command("ckpt-restart", "/s", "j", [("a.img", "00")], lazy=True)
    assert "--lazy" in argv and argv.index("--lazy") < argv.index("a.img")
    assert "--lazy" not in restart_command("ckpt-restart", "/s", "j", [("a.img", "00")])
    with pytest.raises(CkptError, match="--lazy restores a job on this host only"):
        check_lazy({this_host(): this_host(), "h2": "elsewhere-host"})
