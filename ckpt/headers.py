"""The C headers, read with cffi so Python and C cannot drift apart.

Only the block between `/* cffi:begin */` and `/* cffi:end */` is parsed.
Phase names come from `enum ckpt_phase` (CKPT_PHASE_<NAME>) and nowhere else.
"""

import functools
import re

from cffi import FFI, CDefError

from ckpt.errors import CkptError
from ckpt.native import include_dir

HEADER_FILES = ("ckpt_protocol.h", "ckpt_image.h")
_BLOCK = re.compile(r"/\*\s*cffi:begin\s*\*/(.*?)/\*\s*cffi:end\s*\*/", re.S)
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_PHASE_PREFIX = "CKPT_PHASE_"


def cffi_block(text, name="header"):
    """The cdef-able text of a header: the marked block without comments."""
    match = _BLOCK.search(text)
    if not match:
        raise CkptError(f"{name}: no cffi:begin/cffi:end block")
    return _COMMENT.sub(" ", match.group(1))


class Headers:
    """cffi view of the protocol and image headers."""

    def __init__(self, directory):
        self.ffi = FFI()
        for name in HEADER_FILES:
            path = directory / name
            try:
                text = path.read_text()
            except OSError as exc:
                raise CkptError(f"cannot read {path}: {exc.strerror}")
            try:
                self.ffi.cdef(cffi_block(text, str(path)))
            except CDefError as exc:
                raise CkptError(f"cannot parse {path}: {exc}")
        # ABI mode on the running process: only constants are looked up.
        self.lib = self.ffi.dlopen(None)

    def const(self, name):
        return getattr(self.lib, name)

    @functools.cached_property
    def phases(self):
        """Phase name -> number, e.g. {'SUSPEND': 0, ...} (COUNT excluded)."""
        elements = self.ffi.typeof("enum ckpt_phase").relements
        return {
            name[len(_PHASE_PREFIX):]: value
            for name, value in sorted(elements.items(), key=lambda kv: kv[1])
            if name != _PHASE_PREFIX + "COUNT"
        }

    def phase(self, name):
        """Checked phase name: a typo here fails loudly, not on the wire."""
        if name not in self.phases:
            raise CkptError(f"phase {name} is not in ckpt_protocol.h")
        return name


@functools.lru_cache(maxsize=None)
def load_headers(directory=None):
    return Headers(directory if directory is not None else include_dir())


_DEFINE = re.compile(r"^\s*#define\s+(\w+)\s+(0[xX][0-9a-fA-F]+|-?\d+)\s*$", re.M)


@functools.lru_cache(maxsize=None)
def integer_constants(directory=None):
    """{name: value} of the blocks' #defines, without cffi: a host's agent
    needs two of them, and parsing the structs costs a restart 50 ms
    there.  (The blocks' #defines are plain integer literals, so these are
    cffi's values; tests/test_headers.py checks it.)"""
    directory = directory if directory is not None else include_dir()
    values = {}
    for name in HEADER_FILES:
        path = directory / name
        try:
            text = cffi_block(path.read_text(), str(path))
        except OSError as exc:
            raise CkptError(f"cannot read {path}: {exc.strerror}")
        values.update((m.group(1), int(m.group(2), 0)) for m in _DEFINE.finditer(text))
    return values
