"""`ckpt restart`: verify a checkpoint, then restore it under a new coordinator."""

import asyncio
import os

from ckpt.errors import CkptError
from ckpt.image import verify_checkpoint
from ckpt.manifest import resolve_checkpoint
from ckpt.native import restart_binary
from ckpt.session import JobSession, announce

RESTART_REFUSED = 2  # ckpt-restart's exit status before its point of no return


def restart_command(binary, socket_path, job_id, images, status_fd=None):
    """One ckpt-restart per host: it rebuilds that host's process tree.

    images: (path, xxh3) pairs, the tree's root first.  On status_fd it
    says "exited N" if the root exits while others of the job run on."""
    argv = [str(binary), "--coord", socket_path, "--job-id", job_id]
    if status_fd is not None:
        argv += ["--status-fd", str(status_fd)]
    for _path, xxh3 in images:
        argv += ["--xxh3", str(xxh3)]
    return argv + [str(path) for path, _xxh3 in images]


def images_by_host(checkpoint_dir, processes):
    hosts = {}
    for proc in processes:
        hosts.setdefault(proc["host"], []).append((checkpoint_dir / proc["image"], proc["xxh3"]))
    return hosts


def restart(image_dir, config_for):
    """Restore the checkpoint at image_dir; returns the job's exit status.

    config_for(ckpt_dir) gives the settings; the job keeps its directory."""
    checkpoint_dir = resolve_checkpoint(image_dir)
    # Manifest, sizes and headers here; each image's XXH3 is checked by
    # ckpt-restart itself before it changes anything (one pass, not two).
    manifest = verify_checkpoint(checkpoint_dir, checksum=False)
    binary = restart_binary()
    job_dir = checkpoint_dir.parent
    config = config_for(job_dir.parent)
    return asyncio.run(_run(checkpoint_dir, manifest, job_dir, config, binary))


async def _run(checkpoint_dir, manifest, job_dir, config, binary):
    job_id = manifest["job_id"]
    processes = manifest["processes"]
    async with JobSession(job_id=job_id, job_dir=job_dir, command=manifest.get("command") or [],
                          config=config, restarted_from=manifest["checkpoint"]) as job:
        env = job.environment()
        job.signal_targets = lambda: _signal_targets(job, processes[0]["pid"])
        status_read, status_write = os.pipe()
        os.set_inheritable(status_write, True)
        # one host for now: multi-host restart starts one per host remotely
        pids = [job.spawn(restart_command(binary, job.socket_path, job_id, images,
                                          status_write), env)
                for images in images_by_host(checkpoint_dir, processes).values()]
        os.close(status_write)
        await _restore(job, pids, [proc["pid"] for proc in processes])
        announce(job_id)  # only once restored: a refused image says one line
        job.start_periodic()
        ended = asyncio.gather(*(job.wait_exit(pid) for pid in pids))
        root_exit = asyncio.ensure_future(_root_exit(status_read))
        await asyncio.wait([ended, root_exit], return_when=asyncio.FIRST_COMPLETED)
        if ended.done():
            root_exit.cancel()
            return ended.result()[0]
        return await job.lives_on(f"process {processes[0]['pid']}", root_exit.result())


async def _root_exit(fd):
    """The root's status, once ckpt-restart says "exited N"."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                 os.fdopen(fd, "rb", buffering=0))
    while line := await reader.readline():
        word, _, status = line.decode().partition(" ")
        if word == "exited" and status.strip().isdigit():
            return int(status)
    await asyncio.Future()  # no word: ckpt-restart's own exit ends the restart


def _signal_targets(job, root_pid):
    """Signals go to the restored root process once it is back, else to ckpt-restart."""
    for proc in job.coordinator.processes:
        if proc.pid == root_pid and proc.alive:
            return [proc.real_pid]
    return job.children[:1]


async def _restore(job, pids, expected):
    """Run the restart phases; a ckpt-restart that exits first ends the restart."""
    phases = asyncio.ensure_future(job.coordinator.restart(expected))
    exits = [asyncio.ensure_future(job.wait_exit(pid)) for pid in pids]
    try:
        await asyncio.wait([phases, *exits], return_when=asyncio.FIRST_COMPLETED)
        if phases.done():
            phases.result()  # raises CkptError if a phase failed
            return
        phases.cancel()
        code = next(e.result() for e in exits if e.done())
        # status 2: ckpt-restart refused the image and said why in one line
        raise CkptError(f"restart failed: ckpt-restart exited with status {code}",
                        exit_code=code or 1, reported=code == RESTART_REFUSED)
    except BaseException:
        job.coordinator.kill()
        await asyncio.gather(*(job.wait_exit(pid) for pid in pids))
        raise
    finally:
        for task in exits:
            task.cancel()
