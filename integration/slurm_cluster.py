"""A real Slurm (22.05, Debian's) on the multi-host test cluster (cluster.py).

Everything lives under <cluster dir>/slurm on the shared filesystem:
etc/slurm.conf, munge.key (one key, 0400, root's: munged runs as root with
--force), state/ (slurmctld's StateSaveLocation) and log/ (one file per
daemon).  Inside every host: munged with its socket in the host's own
/run/munge (no munge traffic crosses hosts through the shared fs), slurmd
(spool in the host's /run/slurmd), and slurmctld on h1.  The slurm
directory is bind-mounted over /etc/slurm inside each host's mount
namespace only, so `sbatch`, `srun`, `squeue`, `scontrol` run inside a host
find the configuration at its default path; the root /etc/slurm is never
touched.

API (pytest: the session fixture `slurm` in conftest.py, marker slurm):
    s = SlurmCluster(cluster, prolog=None, epilog=None, task_prolog=None)
    s.start() ... s.stop()          # or `with SlurmCluster(c) as s:`
    s.slurm_env() -> environment for Slurm commands (and MPI) inside hosts
    s.run(host, argv, **kw) -> CompletedProcess (text, captured output)
    s.sbatch(host, args) -> job id;  s.job(jobid) -> {"JobState": ...}
    s.wait_job(jobid, states) -> job;  s.node_states() -> {"h1": "idle"}
    s.job_processes(host) -> pids of the host that are not Slurm's daemons
    s.revive(host) -> daemons of a host that died started again, node idle
    s.logs() -> tail of every daemon's log
By hand (from the repository root, on a cluster made by `cluster up`):
    python3 -m integration.slurm_cluster up [--id ID]
    python3 -m integration.cluster run h1 -- sbatch -N 2 --wrap 'srun hostname'
    python3 -m integration.slurm_cluster down [--id ID]
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import psutil

try:
    from . import cluster as cluster_mod
except ImportError:
    import cluster as cluster_mod

DAEMONS = ("munged", "slurmctld", "slurmscriptd", "slurmd", "slurmstepd")
START_TIMEOUT = 60
# the runner's own Slurm/MPI launch settings must not leak into the hosts
DROPPED_ENV = ("HYDRA_LAUNCHER", "HYDRA_BOOTSTRAP", "OMPI_MCA_plm_rsh_agent", "SLURM_CONF")


class SlurmError(RuntimeError):
    pass


def why_unavailable():
    """None if Slurm and munge are installed, else the reason."""
    for tool in ("slurmctld", "slurmd", "munged", "sbatch"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"Slurm is not installed ({tool} missing; setup.sh installs slurm-wlm, munge)"
    return None


class SlurmCluster:
    def __init__(self, cluster, prolog=None, epilog=None, task_prolog=None):
        self.cluster = cluster
        self.prolog, self.epilog, self.task_prolog = prolog, epilog, task_prolog
        self.daemons = {}        # host name -> [root-namespace pid of a daemon]
        self._popens = {}        # host name -> [Popen of nsenter + daemon]
        self._mounted = set()    # hosts whose /etc/slurm is ours

    # -- names ------------------------------------------------------------------
    @property
    def dir(self):
        return self.cluster.dir / "slurm"

    @property
    def etc(self):
        return self.dir / "etc"

    @property
    def log_dir(self):
        return self.dir / "log"

    @property
    def key(self):
        return self.dir / "munge.key"

    # -- life cycle -------------------------------------------------------------
    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def start(self, timeout=START_TIMEOUT):
        reason = why_unavailable()
        if reason:
            raise SlurmError(reason)
        try:
            self._write_files()
            for h in self.cluster.names:
                self._mount_etc(h)
                self._start_munged(h)
            self._start_daemon("h1", ["slurmctld", "-D", "-c"], "slurmctld")
            for h in self.cluster.names:
                self._start_daemon(h, ["slurmd", "-D", "-N", h], f"slurmd-{h}")
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _write_files(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        for d in (self.etc, self.log_dir, self.dir / "state"):
            d.mkdir(parents=True)
        # one key for every host, readable by munged's user (root) only
        fd = os.open(self.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        os.write(fd, os.urandom(1024))
        os.close(fd)
        (self.etc / "slurm.conf").write_text(self.slurm_conf())

    def slurm_conf(self):
        c, d = self.cluster, self.dir
        cpus = max(2, os.cpu_count() or 2)
        names = c.names
        lines = [
            f"ClusterName=ckpt{c.id}",
            f"SlurmctldHost=h1({c.host('h1').address})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "AuthInfo=cred_expire=10",      # a requeued job waits this, not 120 s
            "MpiDefault=none",
            "MailProg=/bin/true",           # no mail here: quiets a startup error
            "ProctrackType=proctrack/linuxproc",   # no cgroups to set up
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",   # with OverSubscribe=FORCE: jobs share nodes
            "SlurmdParameters=config_overrides",   # CPUs= may exceed the machine's
            "ReturnToService=2",
            "JobRequeue=1",
            "PrologFlags=Alloc",
            # short timeouts and a prompt scheduler: tests wait less
            "SlurmctldTimeout=10",
            "SlurmdTimeout=10",
            "MessageTimeout=5",
            "KillWait=5",
            "UnkillableStepTimeout=30",
            "InactiveLimit=0",
            "Waittime=0",
            "MinJobAge=300",                # finished jobs stay in `scontrol show job`
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1,bf_interval=1,defer_batch=0",
            f"StateSaveLocation={d}/state",
            "SlurmdSpoolDir=/run/slurmd",   # each host's own /run
            "SlurmctldPidFile=/run/slurmctld.pid",
            "SlurmdPidFile=/run/slurmd.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log",
            f"SlurmdLogFile={d}/log/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        if self.prolog or self.epilog or self.task_prolog:
            lines.append("PrologEpilogTimeout=60")
        if self.prolog:
            lines.append(f"Prolog={self.prolog}")
        if self.epilog:
            lines.append(f"Epilog={self.epilog}")
        if self.task_prolog:
            lines.append(f"TaskProlog={self.task_prolog}")
        for h in c.hosts:
            lines.append(f"NodeName={h.name} NodeAddr={h.address} CPUs={cpus} State=UNKNOWN")
        lines.append(f"PartitionName=all Nodes={','.join(names)} Default=YES "
                     "MaxTime=INFINITE State=UP OverSubscribe=FORCE:4")
        return "\n".join(lines) + "\n"

    def _host_sh(self, host, script):
        r = self.cluster.run(host, ["sh", "-c", script], capture_output=True, text=True,
                             timeout=30)
        if r.returncode:
            raise SlurmError(f"{host}: {script}: {r.stderr.strip()}")

    def _mount_etc(self, host):
        self._host_sh(host, f"mount --bind {self.etc} /etc/slurm")
        self._mounted.add(host)

    def _start_daemon(self, host, argv, name):
        with open(self.log_dir / f"{name}.out", "ab") as out:
            p = self.cluster.popen(host, argv, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=out, env=self.slurm_env(),
                                   start_new_session=True)
        self._popens.setdefault(host, []).append(p)
        self.daemons.setdefault(host, []).append(p.pid)
        # nsenter forks into the host's pid namespace: the daemon is its child
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                kids = psutil.Process(p.pid).children()
            except psutil.NoSuchProcess:
                kids = []
            if kids:
                self.daemons[host] += [k.pid for k in kids]
                return
            if p.poll() is not None:
                raise SlurmError(f"{name} on {host} exited {p.returncode}: "
                                 + self._tail(self.log_dir / f"{name}.out"))
            time.sleep(0.02)
        raise SlurmError(f"{name} on {host} did not start")

    def _start_munged(self, host):
        self._host_sh(host, "mkdir -p -m 0755 /run/munge /run/slurmd")
        self._start_daemon(host, ["munged", "-F", "--force", f"--key-file={self.key}",
                                  "--socket=/run/munge/munge.socket.2",
                                  "--pid-file=/run/munge/munged.pid",
                                  "--seed-file=/run/munge/munged.seed",
                                  f"--log-file={self.log_dir}/munged-{host}.log"],
                           f"munged-{host}")
        deadline = time.monotonic() + 10
        while True:
            r = self.cluster.run(host, ["sh", "-c", "munge -n | unmunge"],
                                 capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise SlurmError(f"munged on {host} does not answer: {r.stderr.strip()}\n"
                                 + self.logs())
            time.sleep(0.1)

    def _wait_idle(self, timeout):
        deadline = time.monotonic() + timeout
        states = {}
        while time.monotonic() < deadline:
            for p in self._all_popens():   # a daemon that died says why in its log
                if p.poll() is not None:
                    raise SlurmError(f"{' '.join(p.args[p.args.index('--') + 1:])} exited "
                                     f"{p.returncode}\n" + self.logs())
            try:
                states = self.node_states()
            except SlurmError:
                states = {}
            if sorted(states) == sorted(self.cluster.names) and \
                    all(s == "idle" for s in states.values()):
                return
            time.sleep(0.2)
        raise SlurmError(f"Slurm nodes not idle after {timeout} s: {states}\n" + self.logs())

    def stop(self):
        """Cancel every job, end every Slurm daemon and every other process
        of every host but its sshd (a job's leftovers), drop the /etc/slurm
        mounts.  Safe twice and after failures."""
        hosts = [h for h in self.cluster.names if self._host_alive(h)]
        if self.daemons and "h1" in hosts:
            try:
                self.run("h1", ["scancel", "--quiet", "--user=root"], timeout=15)
            except (subprocess.TimeoutExpired, OSError):
                pass
        for host in hosts:
            self._kill_slurm(host)
        for p in self._all_popens():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for host in hosts:
            if host in self._mounted:
                self.cluster.run(host, ["sh", "-c", "umount /etc/slurm; "
                                        "rm -rf /run/munge /run/slurmd /run/slurmctld.pid "
                                        "/run/slurmd.pid"],
                                 capture_output=True, timeout=30)
        self._mounted.clear()
        self._popens, self.daemons = {}, {}

    def _all_popens(self):
        return [p for ps in self._popens.values() for p in ps]

    def revive(self, host, timeout=START_TIMEOUT):
        """Start munged and slurmd again on a host whose daemons were killed
        (a node that died and came back), until Slurm finds it idle.  A
        reboot empties the host's tmpfs: so does this (but Slurm's and
        sshd's own files in /run)."""
        self._kill_slurm(host)
        self._host_sh(host, "rm -rf /run/ckpt /tmp/* /tmp/.[!.]* /dev/shm/* 2>/dev/null; true")
        for p in self._popens.pop(host, []):
            p.wait()
        self.daemons[host] = []
        self._start_munged(host)
        if host == "h1":
            self._start_daemon(host, ["slurmctld", "-D"], "slurmctld")
        self._start_daemon(host, ["slurmd", "-D", "-N", host], f"slurmd-{host}")
        self._wait_idle(timeout)

    def controller_lost(self):
        """None while slurmctld on h1 answers.  Else why it does not (its
        process state or exit status, what sinfo said, the end of its
        logs), after starting it again with its saved state: a controller
        lost in one test must fail that test, not every later one."""
        pid = self._controller_pid()
        for _ in range(3):      # a busy controller gets three chances, ~15 s
            asked = self.run("h1", ["sinfo", "-h"], timeout=30)
            if not pid or not asked.returncode:
                break
        if pid and not asked.returncode:
            return None
        if pid:
            why = (f"slurmctld on h1 (pid {pid}, {self._state(pid)}) does not answer: "
                   f"{asked.stderr.strip()}; stopped on h1: {self._stopped('h1')}")
            cluster_mod.kill_pids([pid])
        else:
            why = "slurmctld on h1 is gone"
            for p in self._popens.get("h1", []):
                if "slurmctld" in p.args and p.poll() is not None:
                    why += f" (exit status {p.returncode})"
        why += "\n" + "\n".join(f"--- {name}\n{self._tail(self.log_dir / name, 40)}"
                                 for name in ("slurmctld.log", "slurmctld.out"))
        self._start_daemon("h1", ["slurmctld", "-D"], "slurmctld")
        deadline = time.monotonic() + START_TIMEOUT
        while self.run("h1", ["sinfo", "-h"], timeout=30).returncode:
            if time.monotonic() > deadline:
                raise SlurmError(why + "\nand slurmctld did not answer once started again")
            time.sleep(0.2)
        return why

    def _stopped(self, host):
        stopped = []
        for pid in self.cluster.processes(host):
            try:
                proc = psutil.Process(pid)
                if proc.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                    stopped.append(f"{pid} {proc.name()}")
            except psutil.NoSuchProcess:
                pass
        return stopped

    def _controller_pid(self):
        for pid in self._slurm_pids("h1"):
            try:
                if psutil.Process(pid).name() == "slurmctld":
                    return pid
            except psutil.NoSuchProcess:
                pass
        return None

    def _host_alive(self, host):
        try:
            h = self.cluster.host(host)
        except KeyError:
            return False
        return bool(h.init_pid) and psutil.pid_exists(h.init_pid)

    def _kill_slurm(self, host):
        """SIGTERM the daemons (they end their steps), then SIGKILL whatever
        of Slurm or its jobs is left on the host (everything but sshd)."""
        daemons = self._slurm_pids(host)
        cluster_mod.kill_pids(daemons, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_running(p) for p in daemons):
            time.sleep(0.05)
        for _ in range(50):
            left = self._slurm_pids(host) + self.job_processes(host)
            if not left:
                return
            cluster_mod.kill_pids(left)
            time.sleep(0.05)

    def _slurm_pids(self, host):
        pids = []
        for pid in self.cluster.processes(host):
            try:
                if psutil.Process(pid).name() in DAEMONS:
                    pids.append(pid)
            except psutil.NoSuchProcess:
                pass
        return pids

    # -- for tests -----------------------------------------------------------------
    def slurm_env(self, **extra):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))
               and k not in DROPPED_ENV}
        env.pop("XDG_RUNTIME_DIR", None)
        env.update(extra)
        return env

    def run(self, host, argv, timeout=60, **kw):
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("env", self.slurm_env())
        return self.cluster.run(host, argv, timeout=timeout, **kw)

    def check(self, host, argv, **kw):
        r = self.run(host, argv, **kw)
        if r.returncode:
            raise SlurmError(f"{' '.join(argv)} on {host}: exit {r.returncode}: "
                             f"{r.stderr.strip()}" + self._unreachable(r.stderr))
        return r.stdout

    def _unreachable(self, stderr):
        """What h1 shows when a client could not reach slurmctld: its
        process, its listening sockets and addresses (empty otherwise)."""
        if "Unable to contact slurm controller" not in stderr:
            return ""
        pid = self._controller_pid()
        shown = self.run("h1", ["sh", "-c", "ss -ltnp; ip -br addr"], timeout=30).stdout
        return (f"\nslurmctld on h1: pid {pid}, {self._state(pid) if pid else 'no process'}; "
                f"stopped on h1: {self._stopped('h1')}\n{shown}{self.logs()}")

    @staticmethod
    def _state(pid):
        try:
            return psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            return "gone meanwhile"

    def sbatch(self, host, args, cwd=None):
        """Submit; the job id."""
        out = self.check(host, ["sbatch", "--parsable", *args],
                         cwd=str(cwd or self.cluster.shared_dir))
        return out.strip().split(";")[0]

    def job(self, jobid):
        """`scontrol show job` as a dict (None once Slurm forgot it)."""
        r = self.run("h1", ["scontrol", "-o", "show", "job", str(jobid)])
        if r.returncode:
            return None
        return dict(re.findall(r"(\S+?)=(\S*)", r.stdout))

    def wait_job(self, jobid, states=("COMPLETED",), timeout=120, until=None):
        """The job once its state is one of states (and until(job) holds)."""
        deadline = time.monotonic() + timeout
        job = None
        while time.monotonic() < deadline:
            job = self.job(jobid)
            if job and job.get("JobState") in states and (until is None or until(job)):
                return job
            time.sleep(0.2)
        raise SlurmError(f"job {jobid} not {'/'.join(states)} in {timeout} s: "
                         f"{job and job.get('JobState')} ({job and job.get('Reason')})\n"
                         + self.logs())

    def node_states(self):
        """{node: state} as sinfo shows it (idle, alloc, mix, drain, down...)."""
        r = self.run("h1", ["sinfo", "-h", "-N", "-o", "%N %T"], timeout=30)
        if r.returncode:
            raise SlurmError(f"sinfo: {r.stderr.strip()}")
        return dict(line.split() for line in r.stdout.splitlines() if line.strip())

    def queue(self):
        """Job ids squeue still lists (pending, running, completing)."""
        r = self.run("h1", ["squeue", "-h", "-o", "%i %T"], timeout=30)
        if r.returncode:
            raise SlurmError(f"squeue: {r.stderr.strip()}" + self._unreachable(r.stderr))
        return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]

    def job_processes(self, host):
        """Processes of the host other than sshd and Slurm's daemons (and
        the nsenter that started them): what jobs left behind."""
        daemons = set(self.daemons.get(host, []))
        left = []
        for pid in self.cluster.processes(host):
            if pid in daemons:
                continue
            try:
                name = psutil.Process(pid).name()
            except psutil.NoSuchProcess:
                continue
            if name in ("sshd", "munged", "slurmctld", "slurmscriptd", "slurmd"):
                continue
            left.append(pid)
        return left

    @staticmethod
    def _tail(path, n=20):
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def logs(self, n=20):
        """The last n lines of every daemon's log."""
        parts = []
        for path in sorted(self.log_dir.glob("*")) if self.log_dir.exists() else []:
            tail = self._tail(path, n)
            if tail:
                parts.append(f"--- {path.name}\n{tail}")
        return "\n".join(parts)


def _running(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# -- by hand ------------------------------------------------------------------------
def _main(argv):
    import argparse
    p = argparse.ArgumentParser(prog="python3 -m integration.slurm_cluster",
                                description="Slurm on a test cluster made by "
                                            "`python3 -m integration.cluster up`")
    p.add_argument("cmd", choices=("up", "down"))
    p.add_argument("--id", type=int, default=None, help="cluster id (default: the only one up)")
    a = p.parse_args(argv)
    try:
        cid = a.id if a.id is not None else cluster_mod._only_cluster()
        s = SlurmCluster(cluster_mod.Cluster.attach(cid))
        t = time.monotonic()
        if a.cmd == "up":
            # a detached cluster outlives us: so must the daemons
            s.start()
            print(f"slurm up on cluster {cid} in {time.monotonic() - t:.2f} s; "
                  f"logs in {s.log_dir}")
        else:
            s._mounted = set(s.cluster.names)
            s.daemons = {h: [] for h in s.cluster.names}
            s.stop()
            print(f"slurm down on cluster {cid} in {time.monotonic() - t:.2f} s")
        return 0
    except (SlurmError, RuntimeError, FileNotFoundError) as e:
        print(f"slurm: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
