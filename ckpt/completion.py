"""Shell completion of job ids and checkpoint directories, for click's
own completion (`eval "$(_CKPT_COMPLETE=bash_source ckpt)"`, README)."""

import os
from pathlib import Path

from click.shell_completion import CompletionItem

from ckpt.errors import CkptError
from ckpt.manifest import MANIFEST_NAME, published_checkpoints
from ckpt.paths import LATEST


def job_ids(ctx, param, incomplete):
    """The running jobs' ids (this host's registry and the shared one)."""
    from ckpt.jobs import list_jobs
    try:
        jobs = list_jobs()
    except Exception:  # completion must never print a traceback into the shell
        return []
    return [CompletionItem(job.job_id, help=" ".join(job.command)[:60])
            for job in jobs if job.job_id.startswith(incomplete)]


def _is_job_dir(path):
    return (path / LATEST).exists() or bool(published_checkpoints(path))


def _shown(path, incomplete):
    """path as the user writes it: relative to here unless they began with /."""
    if incomplete.startswith(("/", "~")):
        return str(path)
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def checkpoint_dirs(ctx, param, incomplete):
    """Job directories and their checkpoints that start with what is typed:
    next to it, and in the configured checkpoint directory; any directory
    when none is (to go on down a path)."""
    typed = Path(os.path.expanduser(incomplete)) if incomplete else Path(".")
    parent = typed if incomplete.endswith("/") or not incomplete else typed.parent
    candidates = []
    try:
        from ckpt.config import load_config
        roots = [parent, load_config().ckpt_dir]
    except Exception:
        roots = [parent]
    for root in roots:
        try:
            entries = [root / name for name in sorted(os.listdir(root))]
        except OSError:
            continue
        for path in entries:
            try:   # a directory we may not look into is no candidate
                if not path.is_dir():
                    continue
                if (path / MANIFEST_NAME).is_file():
                    candidates.append(path)
                elif _is_job_dir(path):
                    candidates.append(path)
                    candidates += [ckpt for _, ckpt in published_checkpoints(path)]
            except (OSError, CkptError):
                continue
    names = []
    for path in candidates:
        name = _shown(path, incomplete)
        if incomplete.startswith("~"):
            name = "~" + name[len(os.path.expanduser("~")):]
        if name.startswith(incomplete) and name not in names:
            names.append(name)
    if not names:
        return [CompletionItem(incomplete, type="dir")]
    return [CompletionItem(name) for name in names]
