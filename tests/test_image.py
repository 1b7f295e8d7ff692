import os

import xxhash
import pytest

from ckpt import ENGINE_VERSION
from ckpt import manifest as m
from ckpt.errors import CkptError
from tests.fakeshim import make_image
from ckpt.headers import cffi_block, load_headers
from ckpt.image import bytes_xxh3, check_header, file_xxh3, verify_checkpoint


def checkpoint_with(tmp_path, data, **manifest_overrides):
    (tmp_path / "proc-42.img").write_bytes(data)
    proc = {"pid": 42, "host": "h", "image": "proc-42.img", "size": len(data),
            "xxh3": bytes_xxh3(data)}
    manifest = m.build_manifest(job_id="job", number=1, command=["app"], processes=[proc],
                                start_ns=1, end_ns=2)
    manifest.update(manifest_overrides)
    m.write_manifest(tmp_path, manifest)
    return tmp_path


def test_headers_come_from_the_c_headers():
    headers = load_headers()
    assert list(headers.phases) == ["SUSPEND", "DRAIN", "WRITE", "RESUME", "REBUILD", "REFILL",
                                    "SYNC", "TERMINATE", "STOP", "RELEASE", "FLUSH"]
    assert headers.const("CKPT_IMAGE_MAGIC") == int.from_bytes(b"CKPTIMG1", "little")
    assert headers.ffi.sizeof("struct ckpt_image_header") <= headers.const("CKPT_HEADER_SIZE")


def test_cffi_block_strips_comments():
    text = "x /* cffi:begin */\n#define A 1 /* one */\n// two\n/* cffi:end */ y"
    assert "one" not in cffi_block(text) and "two" not in cffi_block(text)


def test_good_image(tmp_path):
    directory = checkpoint_with(tmp_path, make_image(42, b"payload" * 100))
    assert verify_checkpoint(directory)["job_id"] == "job"
    assert check_header(directory / "proc-42.img").pid == 42


def test_file_checksum_is_the_hash_of_its_blocks_hashes(tmp_path):
    block = load_headers().const("CKPT_CHECKSUM_BLOCK")
    data = os.urandom(1000) * (block // 1000 * 2 + 3)  # two blocks and a piece
    path = tmp_path / "big"
    path.write_bytes(data)
    digests = b"".join(xxhash.xxh3_64_intdigest(data[i:i + block]).to_bytes(8, "little")
                       for i in (0, block, 2 * block))
    assert file_xxh3(path) == xxhash.xxh3_64_hexdigest(digests) == bytes_xxh3(data)
    assert bytes_xxh3(data[:-1]) != bytes_xxh3(data)
    assert bytes_xxh3(b"") == xxhash.xxh3_64_hexdigest(b"")


@pytest.mark.parametrize("fields, words", [
    ({"magic": 0x1234}, "bad magic"),
    ({"arch": 183}, "aarch64"),
    ({"format_version": 99}, "format version 99"),
])
def test_bad_headers(tmp_path, fields, words):
    directory = checkpoint_with(tmp_path, make_image(42, b"p" * 10, **fields))
    with pytest.raises(CkptError, match=words):
        verify_checkpoint(directory)


def test_header_checksum_mismatch(tmp_path):
    data = bytearray(make_image(42, b"p" * 10))
    data[100] ^= 1  # inside hostname: covered by header_xxh, not by the magic
    directory = checkpoint_with(tmp_path, bytes(data))
    with pytest.raises(CkptError, match="header checksum"):
        verify_checkpoint(directory)


def test_truncated_image(tmp_path):
    data = make_image(42, b"p" * 5000)
    directory = checkpoint_with(tmp_path, data)
    (directory / "proc-42.img").write_bytes(data[:3000])
    with pytest.raises(CkptError, match="truncated"):
        verify_checkpoint(directory)


def test_truncated_inside_header(tmp_path):
    data = make_image(42)[:100]
    directory = checkpoint_with(tmp_path, data)
    with pytest.raises(CkptError, match="truncated"):
        verify_checkpoint(directory)


def test_checksum_mismatch(tmp_path):
    data = make_image(42, b"p" * 5000)
    directory = checkpoint_with(tmp_path, data)
    (directory / "proc-42.img").write_bytes(data[:-1] + b"q")
    with pytest.raises(CkptError, match="checksum mismatch"):
        verify_checkpoint(directory)


def test_missing_image(tmp_path):
    directory = checkpoint_with(tmp_path, make_image(42))
    (directory / "proc-42.img").unlink()
    with pytest.raises(CkptError, match="missing"):
        verify_checkpoint(directory)


def test_other_engine_version(tmp_path):
    directory = checkpoint_with(tmp_path, make_image(42), engine_version="0.0.1-other")
    with pytest.raises(CkptError, match=f"engine 0.0.1-other, this is {ENGINE_VERSION}"):
        verify_checkpoint(directory)


def test_other_manifest_format(tmp_path):
    directory = checkpoint_with(tmp_path, make_image(42), format=7)
    with pytest.raises(CkptError, match="manifest format 7"):
        verify_checkpoint(directory)
