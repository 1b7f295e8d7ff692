"""`ckpt launch`: run a command in the foreground under the checkpoint shim."""

import asyncio
import errno
import os
import secrets
import shutil
import socket
import struct

from ckpt import paths, verify
from ckpt.config import Config
from ckpt.errors import CkptError
from ckpt.jobs import check_job_id
from ckpt.native import preload_libraries, remote_binary
from ckpt.session import JobSession, announce

PT_INTERP = 3
ELF_MAGIC = b"\x7fELF"
# Running the dynamic loader itself (ld.so ./app) still honours LD_PRELOAD.
DYNAMIC_LOADER_PREFIXES = ("ld-linux", "ld.so", "ld64.so")


def new_job_id():
    host = socket.gethostname().split(".")[0] or "job"
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in host)[:40]
    return f"{host}-{secrets.token_hex(3)}"


def _cannot_execute(name, err):
    return CkptError(f"cannot execute {name!r}: {os.strerror(err)}")


def resolve_command(name, path_env=None):
    """The file `name` would execute as, following PATH like execvp."""
    if "/" in name:
        candidate = name
        if not os.path.exists(candidate):
            raise _cannot_execute(name, errno.ENOENT)
    else:
        candidate = shutil.which(name, mode=os.F_OK, path=path_env)
        if candidate is None:
            raise _cannot_execute(name, errno.ENOENT)
    if os.path.isdir(candidate):
        raise _cannot_execute(name, errno.EISDIR)
    if not os.access(candidate, os.X_OK):
        raise _cannot_execute(name, errno.EACCES)
    return candidate


def _read_head(path, size=4096):
    try:
        with open(path, "rb") as exe:
            return exe.read(size)
    except OSError as exc:
        raise CkptError(f"cannot execute {path!r}: {exc.strerror}")


def elf_interpreter(path):
    """PT_INTERP of a 64-bit little-endian ELF, or None (static)."""
    with open(path, "rb") as exe:
        head = exe.read(64)
        if len(head) < 64 or head[4] != 2 or head[5] != 1:
            raise CkptError(f"{path}: only 64-bit little-endian programs can be checkpointed")
        phoff, = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        exe.seek(phoff)
        table = exe.read(phentsize * phnum)
    for index in range(phnum):
        entry = table[index * phentsize:(index + 1) * phentsize]
        if len(entry) < 16:
            break
        p_type, = struct.unpack_from("<I", entry, 0)
        if p_type == PT_INTERP:
            return entry
    return None


def check_program(name, path_env=None, depth=0):
    """Refuse what cannot run under the shim; returns the resolved path."""
    path = resolve_command(name, path_env)
    head = _read_head(path)
    if head.startswith(b"#!") and depth < 4:
        interpreter = head[2:].split(b"\n", 1)[0].strip().split()
        if not interpreter:
            raise CkptError(f"cannot execute {name!r}: empty #! line")
        target = os.fsdecode(interpreter[0])
        try:
            check_program(target, path_env, depth + 1)
        except CkptError as exc:
            raise CkptError(f"cannot execute {name!r}: its interpreter {target}: {exc.message}")
    elif head.startswith(ELF_MAGIC):
        if elf_interpreter(path) is None and not os.path.basename(path).startswith(DYNAMIC_LOADER_PREFIXES):
            raise CkptError(
                f"{name} is statically linked: LD_PRELOAD cannot load the checkpoint shim "
                "into a statically linked program"
            )
    return path


REMOTE_LAUNCHERS = {"ssh": "--ssh", "rsh": "--rsh", "srun": "--srun"}


def remote_wrapped(command):
    """A command that is itself ssh, rsh or srun runs through ckpt-remote,
    as the shim makes a job process's exec of them do: the remote command
    joins the job, the launcher program stays outside it."""
    flag = REMOTE_LAUNCHERS.get(os.path.basename(command[0]))
    return [str(remote_binary()), flag, *command] if flag else command


def job_environment(shim, base):
    """base (the job's CKPT_* variables included) with the shim preloaded."""
    env = dict(base)
    preload = env.get("LD_PRELOAD", "").strip()
    env["LD_PRELOAD"] = f"{shim}:{preload}" if preload else str(shim)
    return env


def launch(command, config: Config, job_id=None, on_session=None):
    """Run `command` under the shim; returns its exit status.
    on_session(job): called once the job's session runs."""
    if not command:
        raise CkptError("no command given (ckpt launch [options] -- CMD ARGS...)", exit_code=2)
    job_id = check_job_id(job_id) if job_id else new_job_id()
    check_program(command[0])
    shim = preload_libraries()
    return asyncio.run(_run(command, config, job_id, shim, on_session))


async def _run(command, config, job_id, shim, on_session):
    job_dir = paths.job_dir(config.ckpt_dir, job_id)
    async with JobSession(job_id=job_id, job_dir=job_dir, command=command, config=config) as job:
        if on_session is not None:
            on_session(job)
        verify.prepare(job.coordinator, config.verify)
        env = job_environment(shim, job.environment())
        announce(job_id)
        pid = job.spawn(remote_wrapped(command), env)
        job.start_periodic()
        status = await job.wait_exit(pid)
        return await job.lives_on(command[0], status, pid)
