"""Where a job's files are; every such path is named here.

    <ckpt-dir>/                       Config.ckpt_dir: every job's directory
      <job-id>/                       the job directory (JobEntry.job_dir)
        ckpt-NNNN/                    a published checkpoint (ckpt/manifest.py)
        .ckpt-NNNN.tmp/               one being written
        latest -> ckpt-NNNN           the newest published
        coordinator.log               a coordinator that outlived its launcher
        .secret-<host>-<pid>          a running coordinator's secret
    <stage-dir>/<job-id>/ckpt-NNNN/   a host's node-local copy (--stage-dir)

A restarted job keeps its directory, wherever it is.  native/flush finds
the staged copy's job directory from the path WRITE gives the shim."""

import re
from pathlib import Path

CKPT_RE = re.compile(r"^ckpt-(\d{4,})$")
TMP_RE = re.compile(r"^\.ckpt-(\d{4,})\.tmp$")
LATEST = "latest"
SECRET_PREFIX = ".secret-"


def job_dir(ckpt_dir, job_id):
    return Path(ckpt_dir) / job_id


def checkpoint_name(number):
    return f"ckpt-{number:04d}"


def checkpoint_number(path):
    return int(CKPT_RE.match(Path(path).name).group(1))


def tmp_name(number):
    return f".{checkpoint_name(number)}.tmp"


def checkpoint_dir(job_dir, number):
    return Path(job_dir) / checkpoint_name(number)


def tmp_dir(job_dir, number):
    """Where checkpoint `number` is written before its publication."""
    return Path(job_dir) / tmp_name(number)


def job_dir_of(checkpoint):
    """The job directory of a checkpoint directory."""
    return Path(checkpoint).parent


def ckpt_dir_of(job):
    """The checkpoint directory a job directory is in (Config.ckpt_dir)."""
    return Path(job).parent


def staged_dir(stage_dir, job_id, number):
    """A host's node-local copy of checkpoint `number` under --stage-dir.
    Its parent holds this job's staged checkpoints and nothing else:
    ckpt-flush removes the older ones it finds there."""
    return Path(stage_dir) / job_id / checkpoint_name(number)


def coordinator_log(job_dir):
    """Where a coordinator that goes on without its launcher writes."""
    return Path(job_dir) / "coordinator.log"


def secret_file(job_dir, host, pid):
    """A coordinator's secret, in the job directory on the shared
    filesystem: other hosts' agents read it there."""
    return Path(job_dir) / f"{SECRET_PREFIX}{host}-{pid}"


def secret_files(job_dir):
    """Every coordinator's secret file in job_dir."""
    return list(Path(job_dir).glob(SECRET_PREFIX + "*"))
