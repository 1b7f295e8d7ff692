"""Each image a process reports against its file, on the host that wrote it.

A process that answers WRITE (written in place) or SYNC (a forked or
staged write, finished) with `file=NAME size=N` says its image is in the
checkpoint directory with N bytes.  Its host checks that before the
answer goes on: the coordinator for its own host's processes, each other
host's agent for its own (docs/PROTOCOL.md, "Host agents"), so the
coordinator looks at no file per process of other hosts: a job of 131,072
processes is 131,072 stat calls, spread over its hosts instead of made in
one process."""

import os

from ckpt.barrier import PhaseError


def bad_name(name):
    """Why an image name is not a plain file of the checkpoint directory, or None."""
    if not name or "/" in name or name.startswith("."):
        return f"a bad image name {name!r}"
    return None


def check(directory, answers, describe=lambda proc: str(proc)):
    """answers: {process: its DONE keys}; those with a size name a complete
    image.  PhaseError for the first image that is not in `directory` with
    the size its process reported."""
    for proc, keys in answers.items():
        size = keys.get("size")
        if size is None:
            continue    # no image yet (a forked writer: its SYNC says), or no image phase
        name = keys.get("file", "")
        why = bad_name(name)
        if why:
            raise PhaseError(f"{describe(proc)} reported {why}")
        try:
            actual = os.stat(os.path.join(directory, name)).st_size
        except OSError:
            raise PhaseError(f"image {name} of {describe(proc)} is not in {directory}")
        if str(actual) != size:
            raise PhaseError(f"image {name} has {actual} bytes, {describe(proc)} reported {size}")
