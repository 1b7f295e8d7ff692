"""Compressed images (--compress none|zstd|auto): engine programs
checkpointed with zstd and auto restart to the uninterrupted run's output;
memory that compresses makes a much smaller image, memory that does not is
stored raw by auto; a damaged compressed chunk is one line of error; a
multi-host MPI job restarts from compressed images on other hosts."""
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from ckpt.headers import load_headers
from ckpt.image import bytes_xxh3, memory_bytes
from harness import Job, restart_and_finish
from test_engine import PROGRAMS

MIXED = ["mixed_memory", "400", "10", "64"]           # 64 MiB that compresses
RANDOM = ["mixed_memory", "400", "10", "64", "random"]  # 64 MiB that does not


VMA_FIELDS = ("data_size", "stored_size", "compression", "path_len", "nruns", "nguards",
              "data_offset")


def memory_records(image):
    """(struct ckpt_vma, its record's offset) of every memory record."""
    h = load_headers()
    ffi, const = h.ffi, h.const
    data = image.read_bytes()
    off, out = const("CKPT_HEADER_SIZE"), []
    while off + 16 <= len(data):
        kind, _pad, size = struct.unpack_from("<IIQ", data, off)
        if kind == const("CKPT_REC_VMA"):
            raw = data[off + 16:off + 16 + ffi.sizeof("struct ckpt_vma")]
            vma = ffi.cast("struct ckpt_vma *", ffi.from_buffer(raw))
            out.append((SimpleNamespace(**{name: getattr(vma, name) for name in VMA_FIELDS}), off))
        if kind == const("CKPT_REC_END"):
            break
        off += 16 + size
    return out


def the_image(checkpoint):
    manifest = yaml.safe_load((checkpoint / "manifest.yaml").read_text())
    assert len(manifest["processes"]) == 1, manifest
    return checkpoint / manifest["processes"][0]["image"]


# every program with zstd; auto (zstd after a sample) differs only in
# which regions it stores raw: a few programs, and the mixed-memory tests
@pytest.mark.parametrize("app,mode", [
    *((app, "zstd") for app in ("counter", "threads", "files", "sharedmem", "private_maps",
                                "guard_pages", "proctree", "sockets", "mem_advice")),
    *((app, "auto") for app in ("counter", "sharedmem", "private_maps", "mem_advice"))])
def test_compressed_checkpoints_restart(session, app, mode):
    """Checkpointed twice with --compress at launch, killed, restarted
    from the first and the last: the output of an uninterrupted run."""
    args = PROGRAMS[app]
    session.start_reference(app, *args)
    job = Job(session, f"z{mode}-{app}", app, *args, launch_args=["--compress", mode])
    job.wait_ready()
    job.checkpoint_at_random_moments(2)
    job.kill()
    reference = session.reference(app, *args)
    for image in (job.images[0], job.images[-1]):
        assert restart_and_finish(session, image, job) == reference, \
            f"{app} restarted from {image.name} ({mode}) differs from an uninterrupted run"


@pytest.mark.parametrize("write", ["--forked", "--in-place"])
def test_compressible_memory_makes_a_much_smaller_image(session, write):
    """The same process checkpointed with none and with zstd: the zstd
    image is less than half as large, lists so in `ckpt images`, and
    restarts to the uninterrupted run's output."""
    reference = session.reference(*MIXED)
    job = Job(session, f"zsize{write}", *MIXED)
    job.wait_ready()
    plain = job.checkpoint("--compress", "none", write)
    packed = job.checkpoint("--compress", "zstd", write)
    job.kill()
    plain_size, packed_size = the_image(plain).stat().st_size, the_image(packed).stat().st_size
    assert packed_size < plain_size / 2, (plain_size, packed_size)
    memory, stored = memory_bytes(the_image(packed))
    assert memory >= 48 << 20 and stored < memory / 2, (memory, stored)
    plain_memory, plain_stored = memory_bytes(the_image(plain))
    # the same memory, give or take a page the program touched in between
    assert plain_stored == plain_memory and abs(plain_memory - memory) < 1 << 20
    listing = session.ckpt("images", packed).stdout
    assert "stored as" in listing and listing.rstrip().endswith("\tok"), listing
    assert restart_and_finish(session, packed, job) == reference


def test_auto_stores_memory_that_does_not_compress_raw(session):
    """auto: the random region's records are stored as they are (samples
    do not shrink); the program's own small records may be compressed."""
    reference = session.reference(*RANDOM)
    job = Job(session, "zauto-random", *RANDOM, launch_args=["--compress", "auto"])
    job.wait_ready()
    path = job.checkpoint()
    job.kill()
    image = the_image(path)
    big = [v for v, _ in memory_records(image) if v.data_size >= 1 << 20]
    assert sum(v.data_size for v in big) >= 60 << 20, [v.data_size for v in big]
    assert all(v.compression == 0 and v.stored_size == v.data_size for v in big)
    memory, stored = memory_bytes(image)
    assert stored > memory * 0.98, (memory, stored)
    assert restart_and_finish(session, path, job) == reference


def damaged(checkpoint, change):
    """The checkpoint with change(image bytes) applied and its manifest's
    size and checksum updated, so that the chunk's own checks must catch it."""
    image = the_image(checkpoint)
    data = bytearray(image.read_bytes())
    change(data)
    image.write_bytes(bytes(data))
    manifest = yaml.safe_load((checkpoint / "manifest.yaml").read_text())
    manifest["processes"][0]["size"] = len(data)
    manifest["processes"][0]["xxh3"] = bytes_xxh3(bytes(data))
    (checkpoint / "manifest.yaml").write_text(yaml.safe_dump(manifest))


def first_zstd_chunk(image):
    """(file offset, stored bytes) of the first zstd chunk of the largest
    compressed record."""
    vma, off = max(((v, o) for v, o in memory_records(image) if v.compression),
                   key=lambda vo: vo[0].data_size)
    data = image.read_bytes()
    table = off + 16 + load_headers().ffi.sizeof("struct ckpt_vma") + vma.path_len + \
        16 * (vma.nruns + vma.nguards)
    chunk_off = vma.data_offset
    for i in range(-(-vma.data_size // (1 << 20))):
        stored, form = struct.unpack_from("<II", data, table + 8 * i)
        if form == 1 and stored > 64:
            return chunk_off, stored
        chunk_off += stored
    raise AssertionError("no zstd chunk")


@pytest.mark.parametrize("where", ["header", "data"])
def test_corrupt_compressed_chunk_is_one_line_of_error(session, where):
    """A damaged frame header is refused before anything is replaced; damaged
    compressed bytes fail the frame's checksum as they are decompressed:
    either way one line, a non-zero exit, nothing left running."""
    job = Job(session, f"zbad-{where}", *MIXED, launch_args=["--compress", "zstd"])
    job.wait_ready()
    path = job.checkpoint()
    job.kill()
    chunk_off, stored = first_zstd_chunk(the_image(path))

    def change(data):
        spot = chunk_off + 5 if where == "header" else chunk_off + stored // 2
        data[spot] ^= 0x5a
    damaged(path, change)
    result = session.ckpt("restart", path, check=False)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr
    assert len(lines) == 1 and lines[0].startswith(("ckpt: error:", "ckpt-restart:")), result.stderr
    assert "compressed" in lines[0], lines[0]
    assert "PASS" not in job.output()


@pytest.mark.multihost
def test_multihost_restart_from_compressed_images(cluster, jobs, request, rng):
    """An MPI ring on h1, h2 checkpointed with --compress zstd from h2,
    restarted on h3, h4: the uninterrupted run's result."""
    from test_multihost import reference_result
    args = (300, 20)
    job = jobs(request.node.name, "openmpi", ["h1", "h2"], "ring", args).start()
    path = job.ckpt("h2", "checkpoint", "--compress", "zstd", "--kill", job.id).stdout.strip()
    assert job.proc.wait(timeout=30) != 0
    compressed = [v for image in sorted(Path(path).glob("*.img"))
                  for v, _ in memory_records(image) if v.compression]
    assert compressed, "no compressed memory record"
    job.restart(path, ["h3", "h4"], "compressed").finish()
    assert job.results() == reference_result(cluster, "openmpi", "ring", args, job.dir)


from test_multihost import jobs  # noqa: E402,F401  (the fixture)
