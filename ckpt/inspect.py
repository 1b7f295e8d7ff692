"""`ckpt inspect`: what a checkpoint's images hold, decoded through the
image header's structs (cffi, ckpt/headers.py; the format: docs/IMAGE.md).
A checkpoint is verified as a restart would (manifest, sizes, headers,
checksums) before any record is read, so a corrupt or foreign image is
refused in one line."""

import os
import stat as stat_module

from ckpt.errors import CkptError
from ckpt.job_status import human_size
from ckpt.headers import load_headers
from ckpt.image import RECORD, verify_checkpoint
from ckpt.manifest import resolve_checkpoint

INSPECT_VERSION = 1
FD_FLAGS = (("O_WRONLY", os.O_WRONLY), ("O_RDWR", os.O_RDWR), ("O_APPEND", os.O_APPEND),
            ("O_NONBLOCK", os.O_NONBLOCK), ("O_DIRECT", os.O_DIRECT), ("O_SYNC", os.O_SYNC))
SOCK_STATES = ((1, "listening"), (2, "connected"), (4, "bound"), (8, "shut-wr"),
               (16, "shut-rd"), (32, "peer-fin"))


def _enum_names(headers, enum, prefix):
    """{value: lower-case name} of a C enum, its prefix cut."""
    return {value: name[len(prefix):].lower().replace("_", "-")
            for name, value in headers.ffi.typeof(enum).relements.items()}


def _text(headers, char_array):
    return headers.ffi.string(char_array).decode("utf-8", "replace")


def _path(raw):
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _prot(prot, shared):
    return "".join(c if prot & bit else "-" for c, bit in (("r", 1), ("w", 2), ("x", 4))) + \
        ("s" if shared else "p")


def _fd_flags(flags):
    words = [name for name, bit in FD_FLAGS if flags & bit] or ["O_RDONLY"]
    return "|".join(words)


def _records(path, headers):
    """(type, offset of its payload, payload size) of each record."""
    size_of_file = os.path.getsize(path)
    with open(path, "rb") as image:
        offset = headers.const("CKPT_HEADER_SIZE")
        while True:
            if offset + RECORD.size > size_of_file:
                raise CkptError(f"image {path} is corrupt (no end record)")
            image.seek(offset)
            kind, _pad, size = RECORD.unpack(image.read(RECORD.size))
            if kind == headers.const("CKPT_REC_END"):
                return
            if size > size_of_file - offset - RECORD.size:
                raise CkptError(f"image {path} is corrupt (a record runs past the end)")
            yield kind, image, offset + RECORD.size, size
            offset += RECORD.size + size


def _struct(headers, image, offset, size, name):
    """The C struct `name` at offset (the record must hold it), and the
    payload's bytes after it (up to 4096 + its own size, for a path)."""
    ffi = headers.ffi
    struct_size = ffi.sizeof(name)
    if size < struct_size:
        raise CkptError(f"image {image.name} is corrupt ({name} record too short)")
    image.seek(offset)
    raw = image.read(min(size, struct_size + 4096))
    return ffi.cast(f"{name} *", ffi.from_buffer(raw)), raw[struct_size:]


def process_contents(path, headers=None):
    """What one image holds, as plain data."""
    headers = headers or load_headers()
    const = headers.const
    vma_kinds = _enum_names(headers, "enum ckpt_vma_kind", "CKPT_VMA_")
    fd_kinds = _enum_names(headers, "enum ckpt_fd_kind", "CKPT_FD_")
    record_kinds = _enum_names(headers, "enum ckpt_record_type", "CKPT_REC_")
    found = {"threads": [], "memory": [], "fds": [], "other_records": {}}
    for kind, image, offset, size in _records(path, headers):
        if kind == const("CKPT_REC_PROCESS"):
            proc, _ = _struct(headers, image, offset, size, "struct ckpt_process")
            found.update(ppid=proc.ppid, pgid=proc.pgid, sid=proc.sid,
                         cwd=_text(headers, proc.cwd), exe=_text(headers, proc.exe),
                         zombies=proc.nzombies, posix_timers=proc.ntimers,
                         pending_signals=proc.shared_pending)
        elif kind == const("CKPT_REC_THREAD"):
            thread, _ = _struct(headers, image, offset, size, "struct ckpt_thread")
            found["threads"].append({"tid": thread.tid, "name": _text(headers, thread.comm)})
        elif kind == const("CKPT_REC_VMA"):
            vma, rest = _struct(headers, image, offset, size, "struct ckpt_vma")
            found["memory"].append({
                "start": vma.start, "end": vma.end, "prot": _prot(vma.prot, vma.shared),
                "kind": vma_kinds.get(vma.kind, str(vma.kind)), "path": _path(rest[:vma.path_len]),
                "saved": vma.data_size, "stored": vma.stored_size,
                "compressed": bool(vma.compression), "pages_elsewhere": vma.nrefs})
        elif kind in (const("CKPT_REC_FD"), const("CKPT_REC_MQUEUE"), const("CKPT_REC_EXE")):
            fd, rest = _struct(headers, image, offset, size, "struct ckpt_fd")
            entry = {"fd": fd.fd, "kind": fd_kinds.get(fd.kind, str(fd.kind)),
                     "path": _path(rest[:fd.path_len]), "flags": _fd_flags(fd.flags),
                     "cloexec": bool(fd.fd_flags & 1), "offset": fd.offset,
                     "data": fd.data_size}
            if fd.kind == const("CKPT_FD_SOCKET"):
                entry["socket"] = {
                    "domain": fd.sock_domain, "type": fd.sock_type,
                    "state": [word for bit, word in SOCK_STATES if fd.sock_flags & bit],
                    "queued": fd.data_size, "peer": fd.peer_id}
            if fd.dup_of >= 0:
                entry["dup_of"] = fd.dup_of
            found["fds"].append(entry)
        else:
            name = record_kinds.get(kind, str(kind))
            found["other_records"][name] = found["other_records"].get(name, 0) + 1
    return found


def inspect(checkpoint, pid=None):
    """The checkpoint's contents ({"v": 1, ...}); pid: that process only.
    CkptError (one line) for a corrupt or foreign checkpoint."""
    directory = resolve_checkpoint(checkpoint)
    manifest = verify_checkpoint(directory)  # every image: size, header, checksum
    headers = load_headers()
    procs = manifest["processes"]
    if pid is not None:
        procs = [p for p in procs if p["pid"] == pid]
        if not procs:
            raise CkptError(f"{directory}: no process {pid} in this checkpoint")
    processes = []
    for proc in procs:
        image = directory / proc["image"]
        if not stat_module.S_ISREG(os.lstat(image).st_mode):
            raise CkptError(f"image {image} is not a regular file")
        contents = process_contents(image, headers)
        processes.append({"pid": proc["pid"], "host": proc["host"], "image": proc["image"],
                          "size": proc["size"], "sources": proc.get("sources", []),
                          **contents})
    return {"v": INSPECT_VERSION, "checkpoint": manifest["checkpoint"], "path": str(directory),
            "job_id": manifest["job_id"], "command": manifest.get("command") or [],
            "hosts": manifest.get("hosts") or [], "parent": manifest.get("parent"),
            "processes": processes}


# ---- text ------------------------------------------------------------------

def _summary(proc):
    saved = sum(region["saved"] for region in proc["memory"])
    return (f"process {proc['pid']} on {proc['host']}: {proc.get('exe', '?')}, "
            f"{len(proc['threads'])} threads, {len(proc['memory'])} memory regions "
            f"({human_size(saved)} saved), {len(proc['fds'])} fds")


def tree_lines(contents):
    """The process tree, a process under its parent (on its host)."""
    procs = contents["processes"]
    known = {(p["host"], p["pid"]) for p in procs}
    children = {}
    for proc in procs:
        parent = (proc["host"], proc.get("ppid"))
        children.setdefault(parent if parent in known else None, []).append(proc)
    lines = []

    def walk(proc, depth):
        lines.append("  " * depth + _summary(proc))
        for child in children.get((proc["host"], proc["pid"]), ()):
            walk(child, depth + 1)
    for root in children.get(None, ()):
        walk(root, 1)
    return lines


def detail_lines(proc):
    lines = [_summary(proc),
             f"  parent {proc.get('ppid')}, process group {proc.get('pgid')}, "
             f"session {proc.get('sid')}, cwd {proc.get('cwd')}"]
    lines.append("  threads: " + ", ".join(f"{t['tid']} {t['name']!r}" for t in proc["threads"]))
    lines.append("  memory:")
    for region in proc["memory"]:
        stored = "" if not region["compressed"] else f" stored as {human_size(region['stored'])}"
        elsewhere = f", {region['pages_elsewhere']} page runs in earlier checkpoints" \
            if region["pages_elsewhere"] else ""
        lines.append(f"    {region['start']:012x}-{region['end']:012x} {region['prot']} "
                     f"{region['kind']:<14} {human_size(region['saved']):>10} saved{stored}{elsewhere}"
                     f"  {region['path']}")
    lines.append("  fds:")
    for fd in proc["fds"]:
        extra = ""
        if "socket" in fd:
            sock = fd["socket"]
            extra = f" {','.join(sock['state']) or 'unconnected'}, {sock['queued']} bytes queued"
        elif fd["data"]:
            extra = f", {fd['data']} bytes saved"
        lines.append(f"    {fd['fd']:>4} {fd['kind']:<12} {fd['flags']} offset {fd['offset']}"
                     f"{extra}  {fd['path']}")
    if proc["other_records"]:
        lines.append("  other: " + ", ".join(f"{n} {k}" for k, n in proc["other_records"].items()))
    return lines


def text_lines(contents, pid=None):
    head = (f"checkpoint {contents['checkpoint']} of job {contents['job_id']} "
            f"({contents['path']}), on {', '.join(contents['hosts'])}")
    if pid is None:
        return [head] + tree_lines(contents)
    return [head] + [line for proc in contents["processes"] for line in detail_lines(proc)]
