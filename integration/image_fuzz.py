"""Seeded mutations of a real checkpoint directory, for test_fuzz_images.py.

A mutant is a copy of the checkpoint with one or two changes to its image
(header fields, record types and lengths, the fields of process, thread,
memory and fd records: counts, offsets, lengths, paths; compressed chunks:
their table and their bytes; truncation) or to
its manifest (keys, types, values, sizes, checksums, image names, the raw
text).  Most image mutants get the manifest's size and XXH3 recomputed,
so the parsers behind the checksum are what is exercised; the others keep
the stale checksum.  Everything depends only on the seed and the
checkpoint's own structure.
"""
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ckpt.headers import load_headers
from ckpt.image import bytes_xxh3, header_checksum

RECORD_STRUCTS = {1: "struct ckpt_process", 2: "struct ckpt_thread",
                  3: "struct ckpt_vma", 4: "struct ckpt_fd"}
REC_VMA, REC_FD, REC_END = 3, 4, 6
ODD_VALUES = [None, -1, 0, 1, 2 ** 31, 2 ** 64, -(2 ** 63), 1.5, "", "x", "../x", "/etc/passwd",
              [], {}, True, "é", "a" * 5000, ["a"], {"a": 1}, "a\nb", ["a\nb"]]
ODD_NAMES = ["../ckpt-0001/{img}", "/etc/passwd", "/{abs}", "sub/{img}", ".{img}", "..", ".",
             "", "{img}\n", "{img}/", "./{img}", "{img}\x00x", "x" * 300]


@dataclass
class Mutant:
    """What was changed (for the failure message) and the files to write."""
    what: list = field(default_factory=list)
    manifest_text: str = None
    image: bytes = None
    image_name: str = None
    extra: list = field(default_factory=list)   # (kind, name, target): symlinks, dirs


def leaf_fields(ffi, ctype, base=0):
    """(offset, size, name) of every integer field of a struct, arrays
    of chars as one byte string (size negative)."""
    out = []
    for name, f in ctype.fields:
        t = f.type
        if t.kind == "primitive":
            out.append((base + f.offset, ffi.sizeof(t), name))
        elif t.kind == "array" and t.item.kind == "primitive" and t.item.cname == "char":
            out.append((base + f.offset, -ffi.sizeof(t), name))
        elif t.kind == "array":
            item = ffi.sizeof(t.item)
            for i in {0, 1, t.length - 1}:
                if t.item.kind == "primitive":
                    out.append((base + f.offset + i * item, item, f"{name}[{i}]"))
                else:
                    out += [(o, s, f"{name}[{i}].{n}")
                            for o, s, n in leaf_fields(ffi, t.item, base + f.offset + i * item)]
        elif t.kind == "struct":
            out += [(o, s, f"{name}.{n}") for o, s, n in leaf_fields(ffi, t, base + f.offset)]
    return out


def records(data, header_size, rec_size):
    """[(type, offset of the record, payload size)] up to the end record."""
    out, off = [], header_size
    while off + rec_size <= len(data):
        rtype, _pad, size = struct.unpack_from("<IIQ", data, off)
        out.append((rtype, off, size))
        if rtype == REC_END or size > len(data):
            break
        off += rec_size + size
    return out


class Fuzzer:
    def __init__(self, checkpoint_dir, rng):
        self.rng = rng
        self.h = load_headers()
        self.ffi = self.h.ffi
        self.manifest = json.loads((Path(checkpoint_dir) / "manifest.yaml").read_text())
        self.proc = self.manifest["processes"][0]
        self.image_name = self.proc["image"]
        self.image = (Path(checkpoint_dir) / self.image_name).read_bytes()
        self.header_size = self.h.const("CKPT_HEADER_SIZE")
        self.rec_size = self.ffi.sizeof("struct ckpt_record")
        self.chunk_size = self.h.const("CKPT_CHUNK_SIZE")
        self.records = records(self.image, self.header_size, self.rec_size)
        self.fields = {rtype: leaf_fields(self.ffi, self.ffi.typeof(name))
                       for rtype, name in RECORD_STRUCTS.items()}
        self.header_fields = leaf_fields(self.ffi, self.ffi.typeof("struct ckpt_image_header"))

    # ---- values -----------------------------------------------------------

    def number(self, old, size):
        """A value for an integer field of `size` bytes: edges, near the
        old value, near the file's size, random bits."""
        bits = size * 8
        r = self.rng
        n = len(self.image)
        choice = r.choice([
            0, 1, (1 << bits) - 1, (1 << (bits - 1)) - 1, 1 << (bits - 1), old + 1, old - 1,
            old ^ (1 << r.randrange(bits)), old * 2, old + 4096, old - 4096, n, n + 1, n - 8,
            r.getrandbits(bits), 1 << r.randrange(bits), 0x7f000000, 0x7f000000 + 4096,
            (1 << 47) - 4096, 1 << 47, 4096 * r.randrange(1, 2048)])
        return choice & ((1 << bits) - 1)

    def set_field(self, data, off, size, name):
        if off + abs(size) > len(data):
            return f"{name}: out of file"
        if size < 0:    # a char array: no NUL, ../, garbage or cut short
            size = -size
            value = self.rng.choice([b"A" * size, b"../../../../etc/passwd", b"\xff" * 8,
                                     bytes(self.rng.getrandbits(8) for _ in range(16))])
            data[off:off + size] = value[:size].ljust(size, b"A" if value[:1] == b"A" else b"\0")
            return f"{name} = {value[:24]!r}"
        old = int.from_bytes(data[off:off + size], "little")
        new = self.number(old, size)
        data[off:off + size] = new.to_bytes(size, "little")
        return f"{name}: {old:#x} -> {new:#x}"

    # ---- image mutations --------------------------------------------------

    def mutate_header(self, data):
        off, size, name = self.rng.choice(self.header_fields)
        what = "header " + self.set_field(data, off, size, name)
        if name != "header_xxh" and self.rng.random() < 0.8:    # as another build would
            checksum = header_checksum(self.h, bytes(data[:self.header_size]))
            xxh = self.ffi.offsetof("struct ckpt_image_header", "header_xxh")
            data[xxh:xxh + 8] = checksum.to_bytes(8, "little")
            what += " (header checksum fixed)"
        return what

    def mutate_record_header(self, data):
        rtype, off, size = self.rng.choice(self.records)
        if self.rng.random() < 0.5:
            new = self.rng.choice([0, 5, 6, 7, 255, 0xffffffff, REC_VMA, REC_FD, 1, 2])
            struct.pack_into("<I", data, off, new)
            return f"record at {off:#x}: type {rtype} -> {new}"
        new = self.number(size, 8)
        struct.pack_into("<Q", data, off + 8, new)
        return f"record at {off:#x} (type {rtype}): size {size:#x} -> {new:#x}"

    def mutate_record_field(self, data):
        candidates = [r for r in self.records if r[0] in self.fields]
        rtype, off, _size = self.rng.choice(candidates)
        # memory and fd records hold most of the lengths and offsets
        if rtype in (REC_VMA, REC_FD) and self.rng.random() < 0.6:
            names = {REC_VMA: ("start", "end", "pgoff", "path_len", "nruns", "data_offset",
                               "data_size", "nguards", "kind", "flags", "shm_id", "sysv_size",
                               "prot", "shared", "compression", "stored_size"),
                     REC_FD: ("fd", "kind", "path_len", "data_size", "dup_of", "share_pid",
                              "share_fd", "nsock_opts", "stdio_fd", "sock_local.len",
                              "sock_peer.len", "offset", "flags", "sock_domain", "sock_type")}
            fields = [f for f in self.fields[rtype] if f[2] in names[rtype]]
        else:
            fields = self.fields[rtype]
        foff, size, name = self.rng.choice(fields)
        pay = off + self.rec_size
        return f"record at {off:#x} (type {rtype}): " + self.set_field(data, pay + foff, size, name)

    def mutate_vma_tail(self, data):
        """The runs, guards and path after a memory record's struct."""
        vmas = [r for r in self.records if r[0] == REC_VMA]
        _t, off, _s = self.rng.choice(vmas)
        pay = off + self.rec_size
        vma = self.ffi.cast("struct ckpt_vma *", self.ffi.from_buffer(bytes(data[pay:pay + 256])))
        tail = pay + self.ffi.sizeof("struct ckpt_vma")
        path_len, nruns = vma.path_len, vma.nruns
        if path_len and self.rng.random() < 0.3:
            new = self.rng.choice([b"/" * path_len, b"\0" * path_len, b"\xff" * path_len,
                                   (b"../" * path_len)[:path_len]])
            data[tail:tail + path_len] = new
            return f"vma at {off:#x}: path -> {new[:20]!r}"
        if not nruns:
            return self.mutate_record_field(data)
        run = tail + path_len + 16 * self.rng.randrange(nruns)
        part = self.rng.choice([0, 8])
        return (f"vma at {off:#x}: run " + ("offset" if part == 0 else "npages") + " "
                + self.set_field(data, run + part, 8, "run"))

    def mutate_chunks(self, data):
        """A compressed memory record's chunk table, or a byte of a chunk."""
        vmas = []
        for _t, off, _s in self.records:
            if _t != REC_VMA:
                continue
            pay = off + self.rec_size
            vma = self.ffi.cast("struct ckpt_vma *", self.ffi.from_buffer(bytes(data[pay:pay + 256])))
            if vma.compression:
                vmas.append((off, pay, vma.path_len, vma.nruns + vma.nguards, vma.data_size,
                             vma.data_offset, vma.stored_size))
        if not vmas:
            return self.mutate_record_field(data)
        off, pay, path_len, nruns, data_size, data_offset, stored = self.rng.choice(vmas)
        nchunks = -(-data_size // self.chunk_size)
        if self.rng.random() < 0.5:
            entry = pay + self.ffi.sizeof("struct ckpt_vma") + path_len + 16 * nruns + \
                8 * self.rng.randrange(nchunks)
            part = self.rng.choice([0, 4])
            return (f"vma at {off:#x}: chunk " + ("stored" if part == 0 else "format") + " "
                    + self.set_field(data, entry + part, 4, "chunk"))
        spot = data_offset + self.rng.randrange(stored)
        data[spot] ^= 1 << self.rng.randrange(8)
        return f"vma at {off:#x}: compressed data bit flipped at {spot:#x}"

    def truncate(self, data):
        cuts = [r[1] for r in self.records] + [r[1] + 8 for r in self.records]
        cut = self.rng.choice(cuts + [self.rng.randrange(len(data)), self.header_size - 1, 1, 0])
        del data[cut:]
        return f"truncated to {cut} bytes"

    def drop_or_repeat_record(self, data):
        rtype, off, size = self.rng.choice(self.records[:-1])
        chunk = bytes(data[off:off + self.rec_size + size])
        if self.rng.random() < 0.5:
            del data[off:off + len(chunk)]
            return f"record at {off:#x} (type {rtype}) removed"
        data[off:off] = chunk
        return f"record at {off:#x} (type {rtype}) repeated"

    def flip_bytes(self, data):
        end = max(r[1] for r in self.records) + self.rec_size
        spots = [self.rng.randrange(self.header_size, end) for _ in range(self.rng.randint(1, 8))]
        for spot in spots:
            data[spot] ^= 1 << self.rng.randrange(8)
        return f"bits flipped at {[hex(s) for s in spots]}"

    def image_mutant(self):
        data = bytearray(self.image)
        ops = [(self.mutate_header, 2), (self.mutate_record_header, 3),
               (self.mutate_record_field, 6), (self.mutate_vma_tail, 2), (self.mutate_chunks, 2),
               (self.truncate, 1),
               (self.drop_or_repeat_record, 1), (self.flip_bytes, 1)]
        m = Mutant()
        chosen = self.rng.choices([o for o, _ in ops], [w for _, w in ops],
                                  k=self.rng.choice([1, 1, 1, 2]))
        # those that move or cut records last: the others use the records' offsets
        for op in sorted(chosen, key=lambda o: o in (self.truncate, self.drop_or_repeat_record)):
            m.what.append(op(data))
            if op in (self.truncate, self.drop_or_repeat_record):
                break
        manifest = json.loads(json.dumps(self.manifest))
        if self.rng.random() < 0.8:     # recorded size and checksum match the damage
            manifest["processes"][0]["size"] = len(data)
            manifest["processes"][0]["xxh3"] = bytes_xxh3(bytes(data))
            m.what.append("manifest size and xxh3 updated")
        m.manifest_text = manifest_text(manifest)
        m.image, m.image_name = bytes(data), self.image_name
        return m

    # ---- manifest mutations -----------------------------------------------

    def manifest_mutant(self):
        r = self.rng
        manifest = json.loads(json.dumps(self.manifest))
        proc = manifest["processes"][0]
        m = Mutant(image=self.image, image_name=self.image_name)
        op = r.randrange(10)
        if op == 0:
            key = r.choice(list(manifest))
            del manifest[key]
            m.what.append(f"no {key}")
        elif op == 1:
            key = r.choice(list(proc))
            del proc[key]
            m.what.append(f"process without {key}")
        elif op in (2, 3):
            key = r.choice(list(manifest))
            manifest[key] = r.choice(ODD_VALUES)
            m.what.append(f"{key} = {manifest[key]!r:.40}")
        elif op in (4, 5):
            key = r.choice(list(proc))
            proc[key] = r.choice(ODD_VALUES + [proc.get(key, 0) + 1 if isinstance(proc.get(key), int)
                                               else 0, 1, 2, 2 ** 22, -2])
            m.what.append(f"process {key} = {proc[key]!r:.40}")
        elif op == 6:
            proc["size"] = self.number(proc["size"], 8) if r.random() < 0.5 else proc["size"] - 1
            if r.random() < 0.5:
                proc["xxh3"] = r.choice(["0" * 16, proc["xxh3"].upper(), proc["xxh3"][:8], "zz",
                                         proc["xxh3"] + "00", "-1", " " + proc["xxh3"]])
            m.what.append(f"size {proc['size']} xxh3 {proc['xxh3']!r}")
        elif op == 7:
            name = r.choice(ODD_NAMES).format(img=self.image_name, abs="tmp/" + self.image_name)
            proc["image"] = name
            m.what.append(f"image {name!r}")
        elif op == 8:
            extra = r.choice(["duplicate", "empty", "two pids"])
            if extra == "duplicate":
                manifest["processes"].append(dict(proc))
            elif extra == "empty":
                manifest["processes"] = []
            else:
                manifest["processes"].append(dict(proc, pid=proc["pid"] + 1))
            m.what.append(f"processes: {extra}")
        else:
            return self.manifest_text_mutant(manifest, m)
        m.manifest_text = manifest_text(manifest)
        return m

    def manifest_text_mutant(self, manifest, m):
        r = self.rng
        text = manifest_text(manifest)
        kind = r.randrange(8)
        if kind == 0:
            cut = r.randrange(len(text))
            text = text[:cut]
            m.what.append(f"manifest cut at {cut}")
        elif kind == 1:
            text = "[" * 100000 + "]" * 100000
            m.what.append("deeply nested manifest")
        elif kind == 2:
            m.what.append("manifest not UTF-8")
            m.manifest_text = text.encode()[:50] + b"\xff\xfe" + text.encode()[50:]
            return m
        elif kind == 3:
            text = "!!python/object/apply:os.system ['true']\n"
            m.what.append("manifest with a python tag")
        elif kind == 4:
            text = "a: &a [1]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\nprocesses: *c\n"
            m.what.append("manifest with aliases")
        elif kind == 5:
            spot = r.randrange(len(text))
            text = text[:spot] + chr(r.randrange(32, 127)) + text[spot + 1:]
            m.what.append(f"manifest byte {spot} changed")
        elif kind == 6:
            text = ""
            m.what.append("empty manifest")
        else:
            m.extra.append(r.choice([("dir", "manifest.yaml", None),
                                     ("symlink", "manifest.yaml", "/etc/passwd"),
                                     ("symlink", self.image_name, "OUTSIDE")]))
            m.what.append(f"{m.extra[-1][0]} {m.extra[-1][1]} -> {m.extra[-1][2]}")
            if m.extra[-1][1] == self.image_name:
                m.image = None
        m.manifest_text = text
        return m

    def mutant(self):
        return self.image_mutant() if self.rng.random() < 0.7 else self.manifest_mutant()


def manifest_text(manifest):
    """As ckpt writes it: JSON, one process per line."""
    head = {k: v for k, v in manifest.items() if k != "processes"}
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    procs = manifest.get("processes")
    if not isinstance(procs, list):
        return json.dumps(manifest)
    procs = ",\n  ".join(json.dumps(p) for p in procs)
    return "{\n" + "\n".join(lines) + f'\n "processes": [\n  {procs}\n ]\n}}\n'


def write_mutant(m, directory, outside_image):
    """The mutant as a checkpoint directory; outside_image: a real image
    outside it, for symlinks that lead out."""
    directory.mkdir()
    extras = {name for _kind, name, _target in m.extra}
    if m.image is not None and m.image_name not in extras:
        (directory / m.image_name).write_bytes(m.image)
    if "manifest.yaml" not in extras:
        path = directory / "manifest.yaml"
        if isinstance(m.manifest_text, bytes):
            path.write_bytes(m.manifest_text)
        else:
            path.write_text(m.manifest_text, errors="surrogateescape")
    for kind, name, target in m.extra:
        if kind == "dir":
            (directory / name).mkdir()
        else:
            os.symlink(outside_image if target == "OUTSIDE" else target, directory / name)
