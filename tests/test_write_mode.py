"""WriteMode: the settings' one value, and the WRITE words it makes."""

from pathlib import Path

from ckpt.config import load_config
from ckpt.write_mode import WriteMode


def test_plain_write_has_no_words():
    assert WriteMode().write_words() == ""
    assert WriteMode().write_words(parent=Path("/j/ckpt-0001")) == ""  # not incremental


def test_words_in_the_shims_order():
    mode = WriteMode(forked=True, compress="zstd", full_every=4, stage_dir=Path("/s"))
    words = mode.write_words(Path("/s/j/ckpt-0002"), Path("/c/j/ckpt-0001"))
    # the paths last, stage before parent: the shim cuts them from the end
    assert words == " fork zstd incremental stage=/s/j/ckpt-0002 parent=/c/j/ckpt-0001"


def test_paths_are_escaped():
    words = WriteMode().write_words(Path("/s/a b/ckpt-0001"))
    assert " " not in words.strip()


def test_a_checkpoint_overrides_and_kill():
    mode = WriteMode(forked=True, compress="auto", full_every=8, stage_dir=Path("/s"))
    assert mode.overridden() == mode
    assert mode.overridden(forked=False, compress="none") == WriteMode(
        forked=False, compress="none", full_every=8, stage_dir=Path("/s"))
    assert mode.before_kill() == WriteMode(compress="auto", full_every=8)


def test_from_the_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("CKPT_CONFIG", str(tmp_path / "none.yaml"))
    for name in ("CKPT_FORKED_WRITE", "CKPT_COMPRESS", "CKPT_INCREMENTAL", "CKPT_FULL_EVERY",
                 "CKPT_STAGE_DIR"):
        monkeypatch.delenv(name, raising=False)
    assert load_config(ckpt_dir=str(tmp_path)).write_mode() == WriteMode(forked=True)
    config = load_config(ckpt_dir=str(tmp_path / "c"), forked_write=False, compress="zstd",
                         incremental=True, full_every=3, stage_dir=str(tmp_path / "s"))
    assert config.write_mode() == WriteMode(compress="zstd", full_every=3,
                                            stage_dir=tmp_path / "s")
    # --full-every alone does not make a job incremental
    assert load_config(ckpt_dir=str(tmp_path), full_every=3).write_mode().full_every == 0
