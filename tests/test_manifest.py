import os

import pytest

from ckpt import manifest as m
from ckpt import paths
from ckpt.errors import CkptError


def sample(number, processes=None):
    processes = processes or [{"pid": 7, "host": "h", "image": "proc-7.img", "size": 3, "xxh3": "00"}]
    return m.build_manifest(job_id="job", number=number, command=["app", "-x"],
                            processes=processes, start_ns=1, end_ns=2, restarted_from=None)


def write_checkpoint(job_dir, number, sources=None, chain=0):
    """sources: the checkpoints its (incremental) image reads from."""
    tmp = paths.tmp_dir(job_dir, number)
    tmp.mkdir(parents=True)
    (tmp / "proc-7.img").write_bytes(b"abc")
    proc = {"pid": 7, "host": "h", "image": "proc-7.img", "size": 3, "xxh3": "00"}
    if sources is not None:
        proc.update(own=1, referred=2, chain=chain, sources=[paths.checkpoint_name(n) for n in sources])
    m.write_manifest(tmp, sample(number, [proc]))
    return m.publish(tmp, paths.checkpoint_dir(job_dir, number))


def test_write_read_roundtrip(tmp_path):
    m.write_manifest(tmp_path, sample(4))
    data = m.read_manifest(tmp_path)
    assert data["job_id"] == "job"
    assert data["checkpoint"] == 4
    assert data["command"] == ["app", "-x"]
    assert data["processes"][0]["image"] == "proc-7.img"
    assert data["hosts"] == ["h"]


def test_a_line_per_process_whatever_their_names(tmp_path):
    # a name that looks like the boundary between two processes' entries
    tricky = 'x}, {"pid": 9.img'
    processes = [{"pid": pid, "host": "h", "image": f"{tricky}{pid}", "size": 3, "xxh3": "00"}
                 for pid in (7, 8, 9)]
    m.write_manifest(tmp_path, sample(4, processes))
    assert m.read_manifest(tmp_path)["processes"] == processes
    lines = (tmp_path / m.MANIFEST_NAME).read_text().splitlines()
    assert [line.strip().startswith('{"pid": ') for line in lines].count(True) == 3


def test_publish_renames_and_points_latest_at_newest(tmp_path):
    first = write_checkpoint(tmp_path, 1)
    second = write_checkpoint(tmp_path, 2)
    assert first.name == "ckpt-0001" and second.name == "ckpt-0002"
    assert os.readlink(tmp_path / "latest") == "ckpt-0002"
    assert not list(tmp_path.glob(".*tmp"))
    assert m.resolve_checkpoint(tmp_path) == second.resolve()
    assert m.next_number(tmp_path) == 3


def test_crash_before_publish_leaves_nothing_valid_looking(tmp_path):
    write_checkpoint(tmp_path, 1)
    # a checkpoint that died half-way: tmp dir with an image and a manifest
    crashed = paths.tmp_dir(tmp_path, 2)
    crashed.mkdir()
    (crashed / "proc-7.img").write_bytes(b"ab")
    m.write_manifest(crashed, sample(2))
    assert [n for n, _ in m.published_checkpoints(tmp_path)] == [1]
    assert os.readlink(tmp_path / "latest") == "ckpt-0001"
    assert m.resolve_checkpoint(tmp_path).name == "ckpt-0001"
    # its number is not reused
    assert m.next_number(tmp_path) == 3


def test_directory_without_manifest_is_not_published(tmp_path):
    (tmp_path / "ckpt-0005").mkdir()
    assert m.published_checkpoints(tmp_path) == []
    with pytest.raises(CkptError, match="no checkpoint"):
        m.resolve_checkpoint(tmp_path)


def test_prune_keeps_newest(tmp_path):
    for number in range(1, 5):
        write_checkpoint(tmp_path, number)
    m.prune(tmp_path, 2)
    assert [n for n, _ in m.published_checkpoints(tmp_path)] == [3, 4]
    assert os.readlink(tmp_path / "latest") == "ckpt-0004"


def test_prune_spares_what_kept_incremental_checkpoints_read(tmp_path):
    """1 full, 2 and 3 incremental (3 reads 1 and 2), 4 full, 5 reads 4 and 1
    (a page unchanged since 1): keep 2 leaves 4, 5 and 1."""
    write_checkpoint(tmp_path, 1, sources=[])
    write_checkpoint(tmp_path, 2, sources=[1], chain=1)
    write_checkpoint(tmp_path, 3, sources=[1, 2], chain=2)
    write_checkpoint(tmp_path, 4, sources=[])
    write_checkpoint(tmp_path, 5, sources=[4, 1], chain=1)
    assert m.read_manifest(tmp_path / "ckpt-0005")["needs"] == [1, 4]
    m.prune(tmp_path, 2)
    assert [n for n, _ in m.published_checkpoints(tmp_path)] == [1, 4, 5]


def test_prune_reads_a_kept_manifest_again_once_it_changed(tmp_path):
    """What a kept checkpoint needs is remembered by its manifest file: one
    rewritten since (by hand) is read again, and a corrupt one stops it."""
    write_checkpoint(tmp_path, 1, sources=[])
    write_checkpoint(tmp_path, 2, sources=[])
    kept = write_checkpoint(tmp_path, 3, sources=[], chain=0)
    m.prune(tmp_path, 5)                       # 3 read (and remembered): needs nothing
    manifest = m.read_manifest(kept)
    manifest["processes"][0]["sources"] = ["ckpt-0001"]
    m.write_manifest(kept, m.build_manifest(**{
        key: manifest[key] for key in ("job_id", "command", "processes", "start_ns", "end_ns")},
        number=3))
    m.prune(tmp_path, 1)
    assert [n for n, _ in m.published_checkpoints(tmp_path)] == [1, 3]
    (kept / m.MANIFEST_NAME).write_text("{{{")
    assert m.prune(tmp_path, 1) == []          # cannot tell what 3 needs now: nothing goes
    assert [n for n, _ in m.published_checkpoints(tmp_path)] == [1, 3]


def test_incremental_parent_and_full_every(tmp_path):
    assert m.incremental_parent(tmp_path, 4) == (None, 0)
    write_checkpoint(tmp_path, 1, sources=[])
    assert m.incremental_parent(tmp_path, 4) == (tmp_path / "ckpt-0001", 1)
    assert m.incremental_parent(tmp_path, 1) == (None, 0)
    write_checkpoint(tmp_path, 2, sources=[1], chain=3)
    assert m.incremental_parent(tmp_path, 4) == (None, 0)   # the 4th is full again


@pytest.mark.parametrize("text, words", [
    ("{{{", "not valid YAML"),
    ("- 1\n", "not a mapping"),
    ("format: 1\n", "no engine_version"),
])
def test_corrupt_manifest(tmp_path, text, words):
    (tmp_path / "manifest.yaml").write_text(text)
    with pytest.raises(CkptError, match=words):
        m.read_manifest(tmp_path)


def test_image_name_may_not_escape_the_directory(tmp_path):
    m.write_manifest(tmp_path, sample(1, [{"pid": 1, "host": "h", "image": "../x", "size": 1, "xxh3": "0"}]))
    with pytest.raises(CkptError, match="bad image name"):
        m.read_manifest(tmp_path)


def test_stage_dir_must_be_an_absolute_path(tmp_path):
    proc = {"pid": 1, "host": "h", "image": "h-1.img", "size": 1, "xxh3": "0"}
    m.write_manifest(tmp_path, dict(sample(1, [proc]), stage_dir="/dev/shm/s"))
    assert m.read_manifest(tmp_path)["stage_dir"] == "/dev/shm/s"
    for bad in ("relative/dir", 7, ["/x"]):
        m.write_manifest(tmp_path, dict(sample(1, [proc]), stage_dir=bad))
        with pytest.raises(CkptError, match="stage_dir is not an absolute path"):
            m.read_manifest(tmp_path)
