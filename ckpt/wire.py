"""Line encoding shared by the coordinator and its clients (docs/PROTOCOL.md)."""

import re

_UNSAFE = re.compile(r"[%\s\x00-\x1f\x7f]")
_ESCAPED = re.compile(r"%([0-9A-Fa-f]{2})")


def escape(value):
    """Make a value space-free: `%20` for space, `%25` for `%` (and controls)."""
    return _UNSAFE.sub(lambda m: "%%%02X" % ord(m.group(0)), str(value))


def unescape(value):
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), value)


def parse_keys(fields):
    """['file=a', 'size=3'] -> {'file': 'a', 'size': '3'} (values unescaped)."""
    keys = {}
    for item in fields:
        name, sep, value = item.partition("=")
        if sep:
            keys[name] = unescape(value)
    return keys


def split_line(raw):
    """Decode one received line; returns (first word, rest of the line)."""
    text = raw.decode("utf-8", "replace").rstrip("\r\n")
    word, _, rest = text.partition(" ")
    return word, rest
