"""Process image checks: the header (read through cffi) and the file's block checksum."""

import os
import platform
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import xxhash

from ckpt import ENGINE_VERSION
from ckpt.errors import CkptError
from ckpt.headers import load_headers
from ckpt import manifest as manifests
from ckpt import paths
from ckpt.manifest import read_manifest

# platform.machine() -> ELF e_machine, as the header's `arch`
ELF_MACHINES = {"x86_64": 62, "aarch64": 183, "ppc64le": 21, "riscv64": 243, "s390x": 22}
ARCH_NAMES = {value: key for key, value in ELF_MACHINES.items()}


def host_arch():
    return ELF_MACHINES.get(platform.machine(), -1)


def arch_name(number):
    return ARCH_NAMES.get(number, f"e_machine {number}")


def _block_digest(block):
    return xxhash.xxh3_64_intdigest(block).to_bytes(8, "little")


def file_xxh3(path):
    """Hex checksum of an image file, as C prints it with %016llx: the
    XXH3-64 of the little-endian XXH3-64s of its CKPT_CHECKSUM_BLOCK-byte
    blocks (so ckpt-restart checks one image on every CPU)."""
    block = load_headers().const("CKPT_CHECKSUM_BLOCK")
    digest = xxhash.xxh3_64()
    with open(path, "rb") as image:
        while data := image.read(block):
            digest.update(_block_digest(data))
    return digest.hexdigest()


def bytes_xxh3(data, block=None):
    """file_xxh3() of a file holding data."""
    block = block or load_headers().const("CKPT_CHECKSUM_BLOCK")
    return xxhash.xxh3_64_hexdigest(b"".join(
        _block_digest(data[i:i + block]) for i in range(0, len(data), block)))


@dataclass
class HeaderInfo:
    pid: int
    nthreads: int
    hostname: str
    engine_version: str
    time_ns: int


def _c_string(ffi, char_array):
    return ffi.string(char_array).decode("utf-8", "replace")


def header_checksum(headers, raw):
    """XXH3-64 of the header struct with its header_xxh field zeroed."""
    ffi = headers.ffi
    copy = bytearray(raw[: ffi.sizeof("struct ckpt_image_header")])
    header = ffi.cast("struct ckpt_image_header *", ffi.from_buffer(copy))
    header.header_xxh = 0
    return xxhash.xxh3_64_intdigest(bytes(copy))


def check_header(path, headers=None):
    """Parse and check an image header; CkptError says what is wrong."""
    headers = headers or load_headers()
    ffi, const = headers.ffi, headers.const
    header_size = const("CKPT_HEADER_SIZE")
    try:
        with open(path, "rb") as image:
            raw = image.read(header_size)
    except OSError as exc:
        raise CkptError(f"cannot read image {path}: {exc.strerror}")
    if len(raw) < ffi.sizeof("struct ckpt_image_header"):
        raise CkptError(f"image {path} is truncated (no complete header)")
    header = ffi.cast("struct ckpt_image_header *", ffi.from_buffer(raw))
    if header.magic != const("CKPT_IMAGE_MAGIC"):
        raise CkptError(f"{path} is not a ckpt image (bad magic)")
    if header.format_version != const("CKPT_IMAGE_VERSION"):
        raise CkptError(
            f"image {path} has format version {header.format_version}, "
            f"this ckpt reads version {const('CKPT_IMAGE_VERSION')}"
        )
    if header.arch != host_arch():
        raise CkptError(
            f"image {path} is for {arch_name(header.arch)}, this machine is {platform.machine()}"
        )
    if header.header_xxh != header_checksum(headers, raw):
        raise CkptError(f"image {path} is corrupt (header checksum mismatch)")
    if header.header_size != header_size or len(raw) < header_size:
        raise CkptError(f"image {path} is corrupt or truncated (header size)")
    return HeaderInfo(
        pid=header.pid,
        nthreads=header.nthreads,
        hostname=_c_string(ffi, header.hostname),
        engine_version=_c_string(ffi, header.engine_version),
        time_ns=header.time_ns,
    )


RECORD = struct.Struct("<IIQ")  # struct ckpt_record: type, pad, size


def memory_records(path, headers=None):
    """Each memory record of an image, in order, as a `struct ckpt_vma *`
    (read it before asking for the next); ValueError if the records do not
    add up, OSError if the file cannot be read."""
    headers = headers or load_headers()
    ffi, const = headers.ffi, headers.const
    vma_size = ffi.sizeof("struct ckpt_vma")
    with open(path, "rb") as image:
        end = os.fstat(image.fileno()).st_size
        offset = const("CKPT_HEADER_SIZE")
        while offset + RECORD.size <= end:
            image.seek(offset)
            kind, _pad, size = RECORD.unpack(image.read(RECORD.size))
            if kind == const("CKPT_REC_END"):
                return
            if size > end - offset - RECORD.size:
                raise ValueError(f"{path}: a record runs past the end")
            if kind == const("CKPT_REC_VMA") and size >= vma_size:
                yield ffi.cast("struct ckpt_vma *", ffi.from_buffer(image.read(vma_size)))
            offset += RECORD.size + size
    raise ValueError(f"{path}: no end record")


def memory_bytes(path, headers=None):
    """(memory, stored): bytes of saved pages in an image's memory records,
    and the bytes they take in the file (less when compressed); None if
    the records do not add up (a damaged image says so elsewhere)."""
    memory = stored = 0
    try:
        for vma in memory_records(path, headers):
            memory += vma.data_size
            stored += vma.stored_size
    except (OSError, ValueError):
        return None
    return memory, stored


def verify_process_image(directory, proc, headers=None, checksum=True):
    """Check one manifest process entry against its file: size, header, XXH3."""
    path = Path(directory) / str(proc["image"])
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise CkptError(f"image {path} is missing")
    except OSError as exc:
        raise CkptError(f"cannot read image {path}: {exc.strerror}")
    # an image is a file of its own checkpoint directory, never a way out of it
    if stat.S_ISLNK(info.st_mode):
        raise CkptError(f"image {path} is a symbolic link (an image must be a file in its checkpoint directory)")
    if not stat.S_ISREG(info.st_mode):
        raise CkptError(f"image {path} is not a regular file")
    size = info.st_size
    if size != proc["size"]:
        raise CkptError(f"image {path} is truncated or damaged ({size} bytes, manifest says {proc['size']})")
    check_header(path, headers)
    if checksum and file_xxh3(path) != str(proc["xxh3"]).lower():
        raise CkptError(f"image {path} is corrupt (checksum mismatch)")
    return path


def verify_checkpoint(directory, headers=None, checksum=True):
    """Check a whole checkpoint before anything is restored; returns the manifest."""
    manifest = read_manifest(directory)
    if manifest["engine_version"] != ENGINE_VERSION:
        raise CkptError(
            f"{directory} was written by ckpt engine {manifest['engine_version']}, "
            f"this is {ENGINE_VERSION}"
        )
    for proc in manifest["processes"]:
        verify_process_image(directory, proc, headers, checksum)
    for number in sorted(manifests.needed_checkpoints(manifest)):
        earlier = paths.checkpoint_dir(paths.job_dir_of(directory), number)
        if not (earlier / manifests.MANIFEST_NAME).is_file():
            raise CkptError(f"{directory} is incremental: it reads memory from {earlier.name}, "
                            "which is gone")
    return manifest
