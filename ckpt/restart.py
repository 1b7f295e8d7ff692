"""`ckpt restart`: verify a checkpoint, then restore it under a new coordinator.

Each of the checkpoint's hosts (in the manifest's order) is restored on one
new host (in the order given, else the same hosts): by a ckpt-restart of
its own, started here for this host and, under the job's agent, through
ssh or srun (ckpt/remote_start.py) on any other."""

import asyncio
import dataclasses
import os
import socket
import sys
import time
from pathlib import Path

from ckpt import events, paths, progress, verify
from ckpt.errors import CkptError
from ckpt.image import verify_checkpoint
from ckpt.jobs import this_host
from ckpt.job_status import human_size
from ckpt.manifest import host_list, resolve_checkpoint
from ckpt.native import restart_binary
from ckpt.remote_start import over_ssh, remote_starter
from ckpt.session import JobSession, announce

RESTART_REFUSED = 2  # ckpt-restart's exit status before its point of no return
RESTORE_FAILED = 70  # after it: the process is lost; ckpt-restart said why in one line


def restart_command(binary, socket_path, job_id, images, status_fd=None, peers=(),
                    addr_map=None, staged_dir=None, lazy=False):
    """One ckpt-restart per host: it rebuilds that host's process tree.

    images: (path, xxh3) pairs, the tree's root first.  On status_fd it
    says "exited N" if the root exits while others of the job run on.
    peers: the other hosts' images, where the far ends of this host's
    connections to them are.  addr_map: {old address: new address}.
    staged_dir: where --stage-dir left node-local copies of the images: one
    there that checks out is read instead."""
    argv = [str(binary), "--coord", socket_path, "--job-id", job_id]
    if status_fd is not None:
        argv += ["--status-fd", str(status_fd)]
    if staged_dir is not None:
        argv += ["--staged-dir", str(staged_dir)]
    if lazy:
        argv += ["--lazy"]
    for old, new in (addr_map or {}).items():
        argv += ["--addr-map", f"{old}={new}"]
    for path in peers:
        argv += ["--peer-image", str(path)]
    for _path, xxh3 in images:
        argv += ["--xxh3", str(xxh3)]
    return argv + [str(path) for path, _xxh3 in images]


def host_spec(words, where):
    """(host, slots or None) of `h3`, `h3:2` (Open MPI's --host form) or a
    hostfile line `h3 slots=2` (other `key=value` words are ignored)."""
    name, colon, count = words[0].partition(":")
    given = [word[len("slots="):] for word in words[1:] if word.startswith("slots=")]
    if given:
        colon, count = ":", given[-1]
    if not colon:
        return name, None
    if not name or not count.isdigit() or int(count) < 1:
        raise CkptError(f"{where}: bad slot count in {' '.join(words)!r} "
                        "(host, host:N or host slots=N, N at least 1)", exit_code=2)
    return name, int(count)


def check_slots(manifest, mapping, slots):
    """A slot is one process of the checkpoint (its image): ranks and the
    processes that started them there (the MPI daemon, ckpt-remote's
    server) alike; what the manifest tells apart is the host, not the
    role.  Refuse a new host with fewer slots than its old host had."""
    counts = {}
    for proc in manifest["processes"]:
        counts[proc["host"]] = counts.get(proc["host"], 0) + 1
    for old_host, new_host in mapping.items():
        have = slots.get(new_host)
        if have is not None and have < counts.get(old_host, 0):
            raise CkptError(f"host {new_host} has {have} slots; the checkpoint has "
                            f"{counts[old_host]} processes on {old_host}, which it replaces",
                            exit_code=2)


def host_mapping(manifest, new_hosts):
    """{old host: new host}: the i-th host of the checkpoint on the i-th new one."""
    old_hosts = host_list(manifest)
    if not new_hosts:
        # a one-host job restarts here; a job of several hosts on the same hosts
        if len(old_hosts) == 1:
            return {old_hosts[0]: this_host()}
        return {host: host for host in old_hosts}
    if len(set(new_hosts)) != len(new_hosts):
        raise CkptError(f"a host is named twice in {','.join(new_hosts)}", exit_code=2)
    if len(new_hosts) < len(old_hosts):
        raise CkptError(f"the checkpoint has {len(old_hosts)} hosts ({', '.join(old_hosts)}); "
                        f"{len(new_hosts)} given", exit_code=2)
    return dict(zip(old_hosts, new_hosts))


def address_of(host):
    try:
        return socket.gethostbyname(host)
    except OSError:
        raise CkptError(f"host {host}: its name does not resolve", exit_code=2)


def address_map(manifest, mapping):
    """{old IPv4 address: new one} for every host that moved."""
    old = manifest.get("addresses") or {}
    moved = {}
    for old_host, new_host in mapping.items():
        if old_host != new_host and old.get(old_host):
            moved[old[old_host]] = address_of(new_host)
    return moved


def images_by_host(checkpoint_dir, processes):
    hosts = {}
    for proc in processes:
        hosts.setdefault(proc["host"], []).append((checkpoint_dir / proc["image"], proc["xxh3"]))
    return hosts


def restart(image_dir, config_for, new_hosts=None, slots=None, launcher=None,
            on_session=None, incremental=None):
    """Restore the checkpoint at image_dir; returns the job's exit status.

    config_for(ckpt_dir) gives the settings; the job keeps its directory.
    new_hosts: where the checkpoint's hosts go, in its order; slots:
    {new host: how many processes it takes} where the user said; launcher:
    how other hosts' ckpt-restart start ("auto", "ssh" or "srun"; None: as
    the settings say).  on_session(job):
    called once the job's session runs.  incremental: the restarted job's
    checkpoints are (True) or are not (False) incremental; None: as the
    checkpoint's job took them."""
    start = time.time()
    checkpoint_dir = resolve_checkpoint(image_dir)
    # Manifest, sizes and headers here; each image's XXH3 is checked by
    # ckpt-restart itself before it changes anything (one pass, not two).
    manifest = verify_checkpoint(checkpoint_dir, checksum=False)
    binary = restart_binary()
    job_dir = paths.job_dir_of(checkpoint_dir)
    config = config_for(paths.ckpt_dir_of(job_dir))
    if incremental is None and manifest.get("full_every"):
        # no word on the command line: an incremental job goes on so
        config = dataclasses.replace(config, incremental=True, full_every=manifest["full_every"])
    if config.stage_dir is None and manifest.get("stage_dir"):
        config = dataclasses.replace(config, stage_dir=Path(manifest["stage_dir"]))
    mapping = host_mapping(manifest, new_hosts)
    if config.lazy:
        check_lazy(mapping)
    check_slots(manifest, mapping, slots or {})
    addr_map = address_map(manifest, mapping)
    remote = [host for host in mapping.values() if host != this_host()]
    hosts = HostPlan(mapping, addr_map, remote_starter(launcher or config.launcher, remote))
    return asyncio.run(_run(checkpoint_dir, manifest, job_dir, config, binary, hosts, on_session,
                            start))


CAP_SYS_PTRACE = 19


def _effective_caps():
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def check_lazy(mapping):
    """--lazy, refused before anything starts where it cannot work: this
    host only (its page server reports on the status fd), and the
    privileges userfaultfd needs: to make one (root, the sysctl, or the
    device), and its fork events (CAP_SYS_PTRACE, which the page server
    needs to follow a process's fork() while pages arrive)."""
    if any(host != this_host() for host in mapping.values()):
        raise CkptError("--lazy restores a job on this host only, for now: restart it without "
                        "--lazy to move it or to restart it on several hosts", exit_code=2)
    sysctl = Path("/proc/sys/vm/unprivileged_userfaultfd")
    try:
        unprivileged = sysctl.read_text().strip() == "1"
    except OSError:
        unprivileged = False
    ptrace = bool(_effective_caps() & (1 << CAP_SYS_PTRACE))
    device = os.access("/dev/userfaultfd", os.R_OK | os.W_OK)
    if not (ptrace or unprivileged or device):
        raise CkptError("--lazy needs userfaultfd, which this user may not use: an administrator "
                        "can allow it by running the restart as root, setting "
                        "vm.unprivileged_userfaultfd=1, or giving read-write access to "
                        "/dev/userfaultfd", exit_code=2)
    if not ptrace:
        raise CkptError("--lazy follows a process's fork() with userfaultfd's fork events, which "
                        "need CAP_SYS_PTRACE: an administrator can allow it by running the "
                        "restart as root", exit_code=2)


@dataclasses.dataclass
class HostPlan:
    """Where each of the checkpoint's hosts goes, and how."""
    mapping: dict       # old host -> new host
    addr_map: dict      # old IPv4 address -> new one
    over: object        # over_ssh or over_srun


def _start_hosts(job, binary, checkpoint_dir, processes, hosts, status_write, staged, lazy):
    """One ckpt-restart per host; returns {pid we wait for: its host}
    (ckpt-restart here, ssh or srun for other hosts).  staged: where each
    host may hold a copy of the checkpoint (--stage-dir), or None."""
    mapping = hosts.mapping
    env = job.environment()
    by_host = images_by_host(checkpoint_dir, processes)
    here = this_host()
    pids = {}
    for old_host, images in by_host.items():
        peers = [path for other, imgs in by_host.items() if other != old_host for path, _ in imgs]
        root_here = old_host == processes[0]["host"] and mapping[old_host] == here
        argv = restart_command(binary, job.socket_path, job.entry.job_id, images,
                               status_write if root_here else None, peers, hosts.addr_map,
                               staged, lazy)
        if mapping[old_host] == here:
            pids[job.spawn(argv, env)] = here
        else:
            pids[job.spawn(*hosts.over(mapping[old_host], argv, env))] = mapping[old_host]
    return pids


async def _run(checkpoint_dir, manifest, job_dir, config, binary, hosts, on_session, start):
    job_id = manifest["job_id"]
    processes = manifest["processes"]
    async with JobSession(job_id=job_id, job_dir=job_dir, command=manifest.get("command") or [],
                          config=config, restarted_from=manifest["checkpoint"]) as job:
        if on_session is not None:
            on_session(job)
        verify.prepare(job.coordinator, config.verify, checkpoint_dir, hosts.mapping)
        job.signal_targets = lambda: _signal_targets(job, processes[0]["pid"])
        status_read, status_write = os.pipe()
        os.set_inheritable(status_write, True)
        stage_dir = manifest.get("stage_dir")
        staged = paths.staged_dir(stage_dir, job_id, manifest["checkpoint"]) if stage_dir else None
        if config.lazy:
            job.coordinator.lazy_left = sum(int(p.get("size", 0)) for p in processes)
        pids = _start_hosts(job, binary, checkpoint_dir, processes, hosts, status_write, staged,
                            config.lazy)
        lazy = LazyProgress(job, job_dir, manifest) if config.lazy else None
        os.close(status_write)
        outcome = events.restart_fields(manifest, checkpoint_dir, start, hosts.mapping)
        try:
            with progress.restart_progress(job.coordinator, manifest, hosts.mapping):
                await _restore(job, pids, [proc["pid"] for proc in processes], hosts.over)
        except CkptError as exc:
            outcome.update(duration_s=round(time.time() - start, 6), error=exc.message)
            events.record(job_dir, "restart_failed", outcome, job.coordinator.warn)
            raise
        outcome.update(duration_s=round(time.time() - start, 6))
        events.record(job_dir, "restart", outcome, job.coordinator.warn)
        announce(job_id)  # only once restored: a refused image says one line
        job.start_periodic()
        ended = asyncio.gather(*(job.wait_exit(pid) for pid in pids))
        root_exit = asyncio.get_running_loop().create_future()
        lines = asyncio.ensure_future(_status_lines(status_read, root_exit, lazy))
        await asyncio.wait([ended, root_exit, lines], return_when=asyncio.FIRST_COMPLETED)
        if not root_exit.done():
            # ckpt-restart ended (its exit decides), or the pipe did
            # without a word: then the same
            await asyncio.wait([lines], timeout=5)  # the page server's last lines, if any
            lines.cancel()
            return (await ended)[0]
        # the job lives on without its root: the page server's lines still count
        lines.add_done_callback(lambda task: task.cancelled() or task.exception())
        return await job.lives_on(f"process {processes[0]['pid']}", root_exit.result())


class LazyProgress:
    """A lazy restart's page server says on the status fd how many bytes
    are still to come ("lazy-left N") and when the last page is in
    ("lazy-done BYTES NS"): the coordinator answers `ckpt status` with
    the first and refuses checkpoints until the second, which is logged."""

    def __init__(self, job, job_dir, manifest):
        self.job, self.job_dir, self.manifest = job, job_dir, manifest

    def line(self, word, rest):
        numbers = [int(n) for n in rest.split() if n.isdigit()]
        if word == "lazy-left" and numbers:
            self.job.coordinator.lazy_left = numbers[0]
        elif word == "lazy-done" and len(numbers) == 2:
            self.job.coordinator.lazy_left = None
            seconds = numbers[1] / 1e9
            events.record(self.job_dir, "lazy_restore_done",
                          events.lazy_done_fields(self.manifest, numbers[0], seconds),
                          self.job.coordinator.warn)
            print(f"ckpt: restart of {self.manifest['job_id']}: the last page is in "
                  f"({human_size(numbers[0])} in {seconds:.2f} s after the page server "
                  "started)", file=sys.stderr, flush=True)


async def _status_lines(fd, root_exit, lazy=None):
    """ckpt-restart's status fd to its end: root_exit gets the root's
    status once it says "exited N"; lazy: a LazyProgress told of the page
    server's lines."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                 os.fdopen(fd, "rb", buffering=0))
    while line := await reader.readline():
        word, _, status = line.decode().partition(" ")
        if word == "exited" and status.strip().isdigit() and not root_exit.done():
            root_exit.set_result(int(status))
        if lazy is not None and word.startswith("lazy-"):
            lazy.line(word, status)


def _signal_targets(job, root_pid):
    """Signals go to the restored root process once it is back, else to ckpt-restart."""
    for proc in job.coordinator.processes:
        if proc.pid == root_pid and proc.alive and proc.agent is None:
            return [proc.real_pid]
    return job.children[:1]


async def _restore(job, pids, expected, over):
    """Run the restart phases; a ckpt-restart that exits first ends the restart."""
    phases = asyncio.ensure_future(job.coordinator.restart(expected))
    exits = {asyncio.ensure_future(job.wait_exit(pid)): pid for pid in pids}
    try:
        await asyncio.wait([phases, *exits], return_when=asyncio.FIRST_COMPLETED)
        if phases.done():
            phases.result()  # raises CkptError if a phase failed
            return
        phases.cancel()
        ended = next(e for e in exits if e.done())
        code, host = ended.result(), pids[exits[ended]]
        if host != this_host():
            unreachable = code == 255 and over is over_ssh
            raise CkptError(f"restart on host {host} failed (status {code}"
                            + (": ssh could not reach it" if unreachable else "") + ")",
                            exit_code=code or 1)
        # status 2 or 70: ckpt-restart said why in one line
        raise CkptError(f"restart failed: ckpt-restart exited with status {code}",
                        exit_code=code or 1, reported=code in (RESTART_REFUSED, RESTORE_FAILED))
    except BaseException:
        job.coordinator.kill()
        await asyncio.gather(*(job.wait_exit(pid) for pid in pids))
        raise
    finally:
        for task in exits:
            task.cancel()
