"""`ckpt inspect`: what a checkpoint's images hold, decoded through the
image header's structs (cffi, ckpt/headers.py; the format: docs/IMAGE.md).
A checkpoint is verified as a restart would (manifest, sizes, headers,
checksums) before any record is read, so a corrupt or foreign image is
refused in one line."""

import os
import signal as signal_module
import stat as stat_module
import struct

from ckpt.errors import CkptError
from ckpt.job_status import human_size
from ckpt.headers import load_headers
from ckpt.image import RECORD, verify_checkpoint
from ckpt.manifest import resolve_checkpoint

INSPECT_VERSION = 1
FD_FLAGS = (("O_WRONLY", os.O_WRONLY), ("O_RDWR", os.O_RDWR), ("O_APPEND", os.O_APPEND),
            ("O_NONBLOCK", os.O_NONBLOCK), ("O_DIRECT", os.O_DIRECT), ("O_SYNC", os.O_SYNC))
# the kernel's resource numbers (getrlimit(2)), in ckpt_process.rlimits' order
RLIMITS = ("cpu", "fsize", "data", "stack", "core", "rss", "nproc", "nofile", "memlock", "as",
           "locks", "sigpending", "msgqueue", "nice", "rtprio", "rttime")
RLIM_INFINITY = (1 << 64) - 1
ITIMERS = ("real", "virtual", "prof")
CLOCKS = {0: "realtime", 1: "monotonic", 2: "process-cputime", 3: "thread-cputime",
          7: "boottime", 8: "realtime-alarm", 9: "boottime-alarm", 11: "tai"}
SIGEV = {0: "signal", 1: "none", 4: "thread-id"}
SA_FLAGS = (("SA_NOCLDSTOP", 0x1), ("SA_NOCLDWAIT", 0x2), ("SA_SIGINFO", 0x4),
            ("SA_ONSTACK", 0x08000000), ("SA_RESTART", 0x10000000),
            ("SA_NODEFER", 0x40000000), ("SA_RESETHAND", 0x80000000))
SIGINFO = struct.Struct("<iii4xiiQ")  # si_signo, si_errno, si_code; pid/tid, uid/overrun, value
SI_CODES = {0: "SI_USER", -1: "SI_QUEUE", -2: "SI_TIMER", -3: "SI_MESGQ", -4: "SI_ASYNCIO",
            -6: "SI_TKILL", 0x80: "SI_KERNEL"}
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


def signal_name(number):
    """SIGUSR1, SIGRTMIN+3 (glibc's SIGRTMIN: 34), or SIG32 for glibc's own."""
    if 34 < number < 64:
        return f"SIGRTMIN+{number - 34}"
    try:
        return signal_module.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def signal_set(mask):
    """The names of a kernel signal set's members (bit n-1: signal n)."""
    return [signal_name(n) for n in range(1, 65) if mask >> (n - 1) & 1]


def _limit(value):
    return None if value == RLIM_INFINITY else value  # null: unlimited


def _handlers(proc):
    """The signals whose disposition is not the default."""
    found = []
    for number in range(1, 65):
        action = proc.sigactions[number]
        if action.handler == 0 and not action.flags and not action.mask:
            continue
        handler = {0: "default", 1: "ignore"}.get(action.handler, f"0x{action.handler:x}")
        found.append({"signal": signal_name(number), "handler": handler,
                      "flags": [name for name, bit in SA_FLAGS if action.flags & bit],
                      "mask": signal_set(action.mask)})
    return found


def _timers(proc):
    itimers = []
    for index, name in enumerate(ITIMERS):
        it = proc.itimers[index]
        if it.value_sec or it.value_usec or it.interval_sec or it.interval_usec:
            itimers.append({"which": name,
                            "value_s": it.value_sec + it.value_usec / 1e6,
                            "interval_s": it.interval_sec + it.interval_usec / 1e6})
    posix = []
    for index in range(min(proc.ntimers, len(proc.timers))):
        timer = proc.timers[index]
        posix.append({"id": timer.id, "clock": CLOCKS.get(timer.clockid, str(timer.clockid)),
                      "notify": SIGEV.get(timer.notify, str(timer.notify)),
                      "signal": signal_name(timer.signo) if timer.signo else None,
                      "tid": timer.tid or None, "value": timer.sigval,
                      "left_s": timer.value_ns / 1e9, "interval_s": timer.interval_ns / 1e9,
                      "armed": timer.value_ns != 0})
    return {"itimers": itimers, "posix": posix}


def _queued(headers, image, offset, size):
    """A CKPT_REC_SIGNALS record: its queue's signals, each siginfo's facts."""
    header = headers.ffi.sizeof("struct ckpt_signal_queue")
    if size < header:
        raise CkptError(f"image {image.name} is corrupt (signal queue record too short)")
    image.seek(offset)
    raw = image.read(size)
    queue = headers.ffi.cast("struct ckpt_signal_queue *", headers.ffi.from_buffer(raw))
    width = headers.const("CKPT_SIGINFO_SIZE")
    if header + queue.count * width > size:
        raise CkptError(f"image {image.name} is corrupt (signal queue runs past its record)")
    found = []
    for index in range(queue.count):
        at = header + index * width
        signo, errno, code, pid, uid, value = SIGINFO.unpack_from(raw, at)
        entry = {"signal": signal_name(signo), "code": SI_CODES.get(code, code)}
        if code in (0, -1, -6):  # sent by a process: kill, sigqueue, tgkill
            entry.update(sender_pid=pid, sender_uid=uid)
        if code in (-1, -2, -3):  # carries a value
            entry["value"] = value
        found.append(entry)
    return queue.tid, found


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
    found = {"threads": [], "memory": [], "fds": [], "other_records": {},
             "signals": {"pending": [], "handlers": [], "queued": []}}
    for kind, image, offset, size in _records(path, headers):
        if kind == const("CKPT_REC_PROCESS"):
            proc, _ = _struct(headers, image, offset, size, "struct ckpt_process")
            found.update(ppid=proc.ppid, pgid=proc.pgid, sid=proc.sid,
                         cwd=_text(headers, proc.cwd), exe=_text(headers, proc.exe),
                         zombies=proc.nzombies, posix_timers=proc.ntimers,
                         pending_signals=proc.shared_pending, timers=_timers(proc),
                         rlimits={name: {"soft": _limit(proc.rlimits[i].cur),
                                         "hard": _limit(proc.rlimits[i].max)}
                                  for i, name in enumerate(RLIMITS)})
            found["signals"]["pending"] = signal_set(proc.shared_pending)
            found["signals"]["handlers"] = _handlers(proc)
        elif kind == const("CKPT_REC_THREAD"):
            thread, _ = _struct(headers, image, offset, size, "struct ckpt_thread")
            found["threads"].append({"tid": thread.tid, "name": _text(headers, thread.comm),
                                     # the mask of the parking signal's handler; the
                                     # application's own is in its signal frame
                                     "blocked_parked": signal_set(thread.sigmask),
                                     "pending": signal_set(thread.pending)})
        elif kind == const("CKPT_REC_SIGNALS"):
            tid, queued = _queued(headers, image, offset, size)
            found["signals"]["queued"].append({"tid": tid or None, "signals": queued})
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
    lines.extend(signal_lines(proc))
    if proc["other_records"]:
        lines.append("  other: " + ", ".join(f"{n} {k}" for k, n in proc["other_records"].items()))
    return lines


def _limit_text(name, value):
    if value is None:
        return "unlimited"
    return human_size(value) if name in ("fsize", "data", "stack", "core", "rss", "memlock",
                                          "as", "msgqueue") else str(value)


def signal_lines(proc):
    """Signals (pending, queued, handlers, each thread's own pending),
    timers and resource limits of a process."""
    signals = proc.get("signals") or {}
    lines = ["  signals:"]
    lines.append("    pending: " + (", ".join(signals.get("pending") or []) or "none"))
    for queue in signals.get("queued") or []:
        whose = f"thread {queue['tid']}" if queue["tid"] else "the process"
        for sig in queue["signals"]:
            sender = f" from pid {sig['sender_pid']} uid {sig['sender_uid']}" \
                if "sender_pid" in sig else ""
            value = f", value {sig['value']}" if "value" in sig else ""
            lines.append(f"    queued for {whose}: {sig['signal']} ({sig['code']}{sender}{value})")
    for thread in proc["threads"]:
        if thread.get("pending"):
            lines.append(f"    pending for thread {thread['tid']}: {', '.join(thread['pending'])}")
    for action in signals.get("handlers") or []:
        flags = f" [{'|'.join(action['flags'])}]" if action["flags"] else ""
        mask = f" blocking {len(action['mask'])} signals" if action["mask"] else ""
        lines.append(f"    handler {action['signal']}: {action['handler']}{flags}{mask}")
    timers = proc.get("timers") or {}
    lines.append("  timers:" + ("" if timers.get("itimers") or timers.get("posix") else " none"))
    for it in timers.get("itimers") or []:
        every = f", every {it['interval_s']:.3f} s" if it["interval_s"] else ""
        lines.append(f"    itimer {it['which']}: {it['value_s']:.3f} s left{every}")
    for timer in timers.get("posix") or []:
        state = f"{timer['left_s']:.3f} s left" if timer["armed"] else "disarmed"
        every = f", every {timer['interval_s']:.3f} s" if timer["interval_s"] else ""
        target = f" {timer['signal']}" if timer["signal"] else ""
        target += f" to thread {timer['tid']}" if timer["tid"] else ""
        lines.append(f"    posix timer {timer['id']} ({timer['clock']}): {state}{every}, "
                     f"notify {timer['notify']}{target}")
    if proc.get("rlimits"):
        lines.append("  rlimits (soft/hard): " + ", ".join(
            f"{name} {_limit_text(name, lim['soft'])}/{_limit_text(name, lim['hard'])}"
            for name, lim in proc["rlimits"].items()))
    return lines


def text_lines(contents, pid=None):
    head = (f"checkpoint {contents['checkpoint']} of job {contents['job_id']} "
            f"({contents['path']}), on {', '.join(contents['hosts'])}")
    if pid is None:
        return [head] + tree_lines(contents)
    return [head] + [line for proc in contents["processes"] for line in detail_lines(proc)]


# ---- diff ------------------------------------------------------------------

DIFF_FD_FIELDS = ("kind", "path", "flags", "cloexec", "offset", "dup_of")
DIFF_REGION_FIELDS = ("prot", "kind", "path")


def _region_name(region):
    return f"{region['start']:012x}-{region['end']:012x}"


def _diff_threads(old, new):
    before = {t["tid"]: t for t in old["threads"]}
    after = {t["tid"]: t for t in new["threads"]}
    return {"added": [after[tid] for tid in after if tid not in before],
            "removed": [before[tid] for tid in before if tid not in after]}


def _diff_memory(old, new):
    """Regions matched by start address, else by end (a stack grows down):
    added, removed, resized (same start or end, another size) and changed
    (protection, kind, path)."""
    before = {r["start"]: r for r in old["memory"]}
    after = {r["start"]: r for r in new["memory"]}
    pairs = [(before[start], after[start]) for start in before if start in after]
    gone = [r for start, r in before.items() if start not in after]
    came = [r for start, r in after.items() if start not in before]
    by_end = {r["end"]: r for r in came}
    still_gone = []
    for region in gone:
        match = by_end.pop(region["end"], None)
        if match is not None:
            pairs.append((region, match))
        else:
            still_gone.append(region)
    came = [r for r in came if r["end"] in by_end and by_end[r["end"]] is r]
    resized, changed = [], []
    for a, b in pairs:
        if (a["start"], a["end"]) != (b["start"], b["end"]):
            resized.append({"before": _region_name(a), "after": _region_name(b),
                            "path": b["path"], "kind": b["kind"],
                            "size_before": a["end"] - a["start"],
                            "size_after": b["end"] - b["start"]})
        fields = {f: [a[f], b[f]] for f in DIFF_REGION_FIELDS if a[f] != b[f]}
        if fields:
            changed.append({"region": _region_name(b), **fields})
    size = sum(r["end"] - r["start"] for r in new["memory"]) - \
        sum(r["end"] - r["start"] for r in old["memory"])
    return {"added": came, "removed": still_gone, "resized": resized, "changed": changed,
            "mapped_bytes": [sum(r["end"] - r["start"] for r in old["memory"]),
                             sum(r["end"] - r["start"] for r in new["memory"])],
            "mapped_change": size,
            "saved_bytes": [sum(r["saved"] for r in old["memory"]),
                            sum(r["saved"] for r in new["memory"])]}


def _diff_fds(old, new):
    before = {fd["fd"]: fd for fd in old["fds"]}
    after = {fd["fd"]: fd for fd in new["fds"]}
    changed = []
    for number in sorted(set(before) & set(after)):
        a, b = before[number], after[number]
        fields = {f: [a.get(f), b.get(f)] for f in DIFF_FD_FIELDS if a.get(f) != b.get(f)}
        if a.get("socket") != b.get("socket"):
            fields["socket"] = [a.get("socket"), b.get("socket")]
        if fields:
            changed.append({"fd": number, **fields})
    return {"opened": [after[n] for n in sorted(set(after) - set(before))],
            "closed": [before[n] for n in sorted(set(before) - set(after))],
            "changed": changed}


def _has_changes(process_diff):
    return any(process_diff["threads"].values()) or any(
        process_diff["memory"][k] for k in ("added", "removed", "resized", "changed")) or \
        any(process_diff["fds"].values()) or "exe_before" in process_diff


def diff(checkpoint_a, checkpoint_b):
    """What changed from checkpoint A to B of one job ({"v": 1, ...});
    CkptError (one line) for a corrupt or foreign image, or two jobs."""
    a, b = inspect(checkpoint_a), inspect(checkpoint_b)
    if a["job_id"] != b["job_id"]:
        raise CkptError(f"{a['path']} and {b['path']} are checkpoints of two jobs "
                        f"({a['job_id']}, {b['job_id']}): --diff compares one job's")
    before = {(p["host"], p["pid"]): p for p in a["processes"]}
    after = {(p["host"], p["pid"]): p for p in b["processes"]}

    def short(proc):
        return {"host": proc["host"], "pid": proc["pid"], "exe": proc.get("exe"),
                "ppid": proc.get("ppid"), "threads": len(proc["threads"])}
    changed = []
    for key in [k for k in after if k in before]:
        old, new = before[key], after[key]
        entry = {"host": key[0], "pid": key[1], "exe": new.get("exe"),
                 "threads": _diff_threads(old, new), "memory": _diff_memory(old, new),
                 "fds": _diff_fds(old, new)}
        if old.get("exe") != new.get("exe"):
            entry["exe_before"] = old.get("exe")  # it exec'd another program
        changed.append(entry)
    return {"v": INSPECT_VERSION, "job_id": a["job_id"],
            "a": {"checkpoint": a["checkpoint"], "path": a["path"]},
            "b": {"checkpoint": b["checkpoint"], "path": b["path"]},
            "appeared": [short(after[k]) for k in after if k not in before],
            "gone": [short(before[k]) for k in before if k not in after],
            "changed": [c for c in changed if _has_changes(c)],
            "unchanged": [c["pid"] for c in changed if not _has_changes(c)]}


def _signed_size(change):
    return ("+" if change >= 0 else "-") + human_size(abs(change))


def diff_lines(found):
    lines = [f"job {found['job_id']}: checkpoint {found['a']['checkpoint']} "
             f"({found['a']['path']}) -> checkpoint {found['b']['checkpoint']} "
             f"({found['b']['path']})"]
    for proc in found["appeared"]:
        lines.append(f"+ process {proc['pid']} on {proc['host']}: {proc['exe']}, parent "
                     f"{proc['ppid']}, {proc['threads']} threads")
    for proc in found["gone"]:
        lines.append(f"- process {proc['pid']} on {proc['host']}: {proc['exe']}")
    for proc in found["changed"]:
        memory = proc["memory"]
        lines.append(f"~ process {proc['pid']} on {proc['host']}: {proc['exe']}"
                     + (f" (was {proc['exe_before']})" if "exe_before" in proc else "")
                     + f"; mapped {human_size(memory['mapped_bytes'][0])} -> "
                     f"{human_size(memory['mapped_bytes'][1])}, saved "
                     f"{human_size(memory['saved_bytes'][0])} -> "
                     f"{human_size(memory['saved_bytes'][1])}")
        for thread in proc["threads"]["added"]:
            lines.append(f"    + thread {thread['tid']} {thread['name']!r}")
        for thread in proc["threads"]["removed"]:
            lines.append(f"    - thread {thread['tid']} {thread['name']!r}")
        for region in memory["added"]:
            lines.append(f"    + memory {_region_name(region)} {region['prot']} {region['kind']} "
                         f"{human_size(region['end'] - region['start'])}  {region['path']}")
        for region in memory["removed"]:
            lines.append(f"    - memory {_region_name(region)} {region['prot']} "
                         f"{region['kind']} {human_size(region['end'] - region['start'])}  "
                         f"{region['path']}")
        for region in memory["resized"]:
            lines.append(f"    ~ memory {region['before']} -> {region['after']} {region['kind']} "
                         f"{human_size(region['size_before'])} -> "
                         f"{human_size(region['size_after'])} "
                         f"({_signed_size(region['size_after'] - region['size_before'])})"
                         f"  {region['path']}")
        for region in memory["changed"]:
            what = ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in region.items() if k != "region")
            lines.append(f"    ~ memory {region['region']}: {what}")
        for fd in proc["fds"]["opened"]:
            lines.append(f"    + fd {fd['fd']} {fd['kind']} {fd['flags']} offset {fd['offset']}"
                         f"  {fd['path']}")
        for fd in proc["fds"]["closed"]:
            lines.append(f"    - fd {fd['fd']} {fd['kind']}  {fd['path']}")
        for fd in proc["fds"]["changed"]:
            what = ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in fd.items()
                             if k not in ("fd", "socket"))
            if "socket" in fd:
                what += (", " if what else "") + "socket state or queue changed"
            lines.append(f"    ~ fd {fd['fd']}: {what}")
    if found["unchanged"]:
        lines.append(f"  unchanged: {len(found['unchanged'])} processes")
    if not (found["appeared"] or found["gone"] or found["changed"]):
        lines.append("  no change")
    return lines
