"""Settings: YAML file < CKPT_* environment < command-line flags."""

import os
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path

import yaml

from ckpt.errors import CkptError
from ckpt.write_mode import COMPRESS_MODES, WriteMode

ENV_PREFIX = "CKPT_"
# config key -> environment variable
ENV_NAMES = {
    "ckpt_dir": "CKPT_DIR",
    "interval": "CKPT_INTERVAL",
    "barrier_timeout": "CKPT_BARRIER_TIMEOUT",
    "keep": "CKPT_KEEP",
    "forked_write": "CKPT_FORKED_WRITE",
    "compress": "CKPT_COMPRESS",
    "incremental": "CKPT_INCREMENTAL",
    "full_every": "CKPT_FULL_EVERY",
    "stage_dir": "CKPT_STAGE_DIR",
    "verify": "CKPT_VERIFY",
    "lazy": "CKPT_LAZY",
    "launcher": "CKPT_LAUNCHER",
}
FULL_EVERY_MAX = 64  # an image refers to at most this many earlier ones
VERIFY_MODES = ("on", "warn", "off")  # ckpt/verify.py
LAUNCHER_SETTINGS = ("auto", "ssh", "srun")  # ckpt/remote_start.py


@dataclass(frozen=True)
class Config:
    ckpt_dir: Path
    interval: float = 0.0          # seconds between periodic checkpoints; 0 = off
    barrier_timeout: float = 120.0  # seconds each phase may take
    keep: int = 0                  # checkpoints kept per job; 0 = all
    forked_write: bool = True      # a copy-on-write child writes; the job resumes at once
    # page data: none, zstd, or zstd where samples shrink (not the default
    # yet: a compressed image restarts slower than a raw one on few cores)
    compress: str = "none"
    # write only the pages that changed since the previous checkpoint, and
    # a full checkpoint every full_every (bounds what a restart reads)
    incremental: bool = False
    full_every: int = 8
    # node-local directory the images are written to first, then copied
    # to ckpt_dir in the background; None: straight to ckpt_dir
    stage_dir: Path = None
    # a restart compares the restored processes with the checkpoint's
    # fingerprint of them (ckpt/verify.py): a difference fails it (on), is
    # a warning (warn); off: no fingerprint at checkpoints, no comparison.
    # warn by default until the restores it finds wrong in the suite's own
    # programs are fixed (an fd from outside the job shared by several
    # processes comes back as one per process, shared anonymous memory as
    # a memfd, a FIFO's write end as O_RDWR, ...: issue 37)
    verify: str = "warn"
    # a restart resumes the processes before their private memory is back:
    # pages come on demand (userfaultfd) and in the background (docs/LAZY.md)
    lazy: bool = False
    # how a restart starts other hosts' ckpt-restart: srun inside a Slurm
    # allocation (sites often forbid ssh between compute nodes), else ssh
    # (auto); or always ssh, or always srun (ckpt/remote_start.py)
    launcher: str = "auto"

    def write_mode(self):
        """How the job's checkpoints are written, as these settings say."""
        return WriteMode(forked=self.forked_write, compress=self.compress,
                         full_every=self.full_every if self.incremental else 0,
                         stage_dir=self.stage_dir)


# the defaults above by name (the CLI's help quotes them)
DEFAULTS = {f.name: f.default for f in fields(Config) if f.default is not MISSING}


def default_config():
    return Config(ckpt_dir=Path.cwd() / "ckpt-images")


def config_path(environ=None):
    environ = os.environ if environ is None else environ
    override = environ.get("CKPT_CONFIG")
    if override:
        return Path(override)
    base = environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "ckpt" / "config.yaml"


def _seconds(value, key, source, allow_zero):
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise CkptError(f"{source}: {key} must be a number of seconds, not {value!r}")
    if number < 0 or (number == 0 and not allow_zero) or number != number:
        raise CkptError(f"{source}: {key} must be a positive number of seconds")
    return number


def _keep(value, source):
    if value in (None, "all"):
        return 0
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise CkptError(f"{source}: keep must be a whole number or 'all', not {value!r}")
    if number < 1:  # "keep 0" reads as keeping none, which no checkpointing job wants
        raise CkptError(f"{source}: keep must be at least 1, or 'all'")
    return number


def _flag(value, key, source):
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "yes", "true", "on"):
        return True
    if text in ("0", "no", "false", "off", ""):
        return False
    raise CkptError(f"{source}: {key} must be yes or no, not {value!r}")


def _compress(value, source):
    text = str(value).strip().lower()
    if text not in COMPRESS_MODES:
        raise CkptError(f"{source}: compress must be none, zstd or auto, not {value!r}")
    return text


def _verify(value, source):
    if isinstance(value, bool):  # YAML reads a bare on/off as a boolean
        return "on" if value else "off"
    text = str(value).strip().lower()
    if text not in VERIFY_MODES:
        raise CkptError(f"{source}: verify must be on, warn or off, not {value!r}")
    return text


def _launcher(value, source):
    text = str(value).strip().lower()
    if text not in LAUNCHER_SETTINGS:
        raise CkptError(f"{source}: launcher must be auto, ssh or srun, not {value!r}")
    return text


def _full_every(value, source):
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise CkptError(f"{source}: full_every must be a whole number, not {value!r}")
    if not 1 <= number <= FULL_EVERY_MAX:
        raise CkptError(f"{source}: full_every must be between 1 and {FULL_EVERY_MAX}")
    return number


def _convert(key, value, source):
    """One raw value (from YAML, env or a flag) to its typed form."""
    if key in ("ckpt_dir", "stage_dir"):
        if key == "stage_dir" and value in (None, ""):
            return None
        if not isinstance(value, (str, Path)) or not str(value):
            raise CkptError(f"{source}: {key} must be a path")
        return Path(os.path.expanduser(str(value))).absolute()
    if key == "interval":
        return 0.0 if value is None else _seconds(value, key, source, allow_zero=True)
    if key == "barrier_timeout":
        return _seconds(value, key, source, allow_zero=False)
    if key == "keep":
        return _keep(value, source)
    if key in ("forked_write", "incremental", "lazy"):
        return _flag(value, key, source)
    if key == "full_every":
        return _full_every(value, source)
    if key == "compress":
        return _compress(value, source)
    if key == "verify":
        return _verify(value, source)
    if key == "launcher":
        return _launcher(value, source)
    raise CkptError(f"{source}: unknown setting {key!r}")


def _from_file(path):
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CkptError(f"cannot read config file {path}: {exc.strerror}")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" line {where.line + 1}" if where else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise CkptError(f"bad config file {path}{line}: {problem}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CkptError(f"bad config file {path}: expected a mapping of settings")
    known = {f.name for f in fields(Config)}
    for key in data:
        if key not in known:
            raise CkptError(f"bad config file {path}: unknown setting {key!r}")
    return {key: _convert(key, value, f"config file {path}") for key, value in data.items()}


def _from_env(environ):
    values = {}
    for key, name in ENV_NAMES.items():
        if environ.get(name, "") != "":
            values[key] = _convert(key, environ[name], name)
    return values


def load_config(environ=None, **flags):
    """The effective settings; flags left at None do not override."""
    environ = os.environ if environ is None else environ
    config = default_config()
    config = replace(config, **_from_file(config_path(environ)))
    config = replace(config, **_from_env(environ))
    given = {k: _convert(k, v, "--" + k.replace("_", "-")) for k, v in flags.items() if v is not None}
    config = replace(config, **given)
    if config.stage_dir == config.ckpt_dir:
        # <stage>/<job>/ckpt-NNNN would be the checkpoint's own directory
        raise CkptError(f"the stage directory cannot be the checkpoint directory ({config.ckpt_dir})")
    return config
