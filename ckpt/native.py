"""Where the C half lives: the shim, the restart binary and the headers."""

import os
import shutil
from pathlib import Path

from ckpt.errors import CkptError

SHIM_NAME = "libckpt.so"
RESTART_NAME = "ckpt-restart"
PLUGINS = ("ib", "pmix")


def native_dir():
    """`$CKPT_NATIVE_DIR`, else `native/` next to the package in the repo."""
    override = os.environ.get("CKPT_NATIVE_DIR")
    if override:
        return Path(override).resolve()
    return Path(__file__).resolve().parent.parent / "native"


def include_dir():
    return native_dir() / "include"


def shim_path():
    path = native_dir() / SHIM_NAME
    if not path.is_file():
        raise CkptError(f"checkpoint shim {path} not found (build native/ or set CKPT_NATIVE_DIR)")
    return path


def preload_libraries():
    """The shim, then the plugins that are built (plugins/<name>/libckpt_<name>.so):
    a plugin finds the shim's services already loaded."""
    libs = [shim_path()]
    plugins = native_dir().parent / "plugins"
    for name in PLUGINS:
        lib = plugins / name / f"libckpt_{name}.so"
        if lib.is_file():
            libs.append(lib)
    return ":".join(str(lib) for lib in libs)


def cli_path():
    """A program that runs this ckpt's command line: the checkout's
    bin/ckpt, else the installed `ckpt`."""
    checkout = Path(__file__).resolve().parent.parent / "bin" / "ckpt"
    if checkout.is_file():
        return checkout
    installed = shutil.which("ckpt")
    if installed is None:
        raise CkptError("the ckpt command is not on PATH (agents on other hosts need it)")
    return Path(installed)


def remote_binary():
    """ckpt-remote: ssh, rsh and srun inside a job."""
    path = native_dir() / "ckpt-remote"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise CkptError(f"{path} not found (build native/ or set CKPT_NATIVE_DIR)")
    return path


def restart_binary():
    path = native_dir() / RESTART_NAME
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise CkptError(f"restart binary {path} not found (build native/ or set CKPT_NATIVE_DIR)")
    return path
