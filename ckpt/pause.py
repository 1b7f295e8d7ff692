"""CKPT_PAUSE_BEFORE=PHASE:PATH, a debugging and fault-injection aid.

Before the coordinator sends PHASE to the job (a barrier's name, or
PUBLISH for the manifest and publication), if PATH.arm exists it writes
the job's processes to PATH (JSON: pid, real pid, host, and its own pid),
deletes PATH.arm and waits until PATH is removed.  One arming, one pause:
whoever armed it acts on a real checkpoint or restart held between two
phases (integration/test_fault_matrix.py kills, fills the disk), then lets
it go on by removing PATH."""

import asyncio
import json
import os
from pathlib import Path

POLL_SECONDS = 0.02


def pause_point(environ=None):
    """(phase, path) from CKPT_PAUSE_BEFORE, or None."""
    spec = (environ if environ is not None else os.environ).get("CKPT_PAUSE_BEFORE", "")
    phase, colon, path = spec.partition(":")
    return (phase, Path(path)) if colon and phase and path else None


async def pause_before(point, phase, processes):
    """Hold here while point is armed for phase (see the module's text)."""
    if point is None or point[0] != phase:
        return
    path = point[1]
    arm = path.with_name(path.name + ".arm")
    if not arm.exists():
        return
    held = {"phase": phase, "coordinator": os.getpid(),
            "processes": [{"pid": p.pid, "real_pid": p.real_pid, "host": p.host}
                          for p in processes if p.alive]}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(held))
    os.rename(tmp, path)
    arm.unlink(missing_ok=True)
    while path.exists():
        await asyncio.sleep(POLL_SECONDS)
