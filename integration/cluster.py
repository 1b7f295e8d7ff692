"""A multi-host test cluster on one machine (root, Linux network namespaces).

Each host h1..hN is a network namespace (`ckpt<ID>-hI`, under /run/netns) on
one bridge (`ckpt<ID>br`, address 198.18.ID.254 in the root namespace so the
runner can reach hosts) with its own address 198.18.ID.I/24, hostname (UTS),
/tmp, /dev/shm and /run (mount namespace, private propagation, tmpfs), SysV
IPC, pid namespace with its own /proc, and its own sshd (Debian's, -D, child
of the host's init).  The rest of the filesystem is shared, as on a cluster.
Host names resolve through a cluster hosts file bind-mounted over /etc/hosts
inside every host (the root /etc/hosts is never touched, so two clusters --
two agents on one machine -- can coexist: ID is picked free under a lock).
ssh between hosts as root: a throwaway key and a cluster ssh_config
bind-mounted over /etc/ssh/ssh_config inside the hosts.

API (pytest: the session fixture `cluster` in conftest.py, marker multihost):
    c = Cluster(n=4); c.start() ... c.stop()   # or `with Cluster() as c:`
    c.hosts -> [Host]; c.host("h1"); c.names -> ["h1", ...]; c.subnet
    c.shared_dir -> Path on the shared filesystem (NOT /tmp: /tmp is per host)
    c.run(host, argv, **subprocess_kw) -> CompletedProcess   (runs inside host)
    c.popen(host, argv, **subprocess_kw) -> Popen
    c.enter_argv(host) -> ["nsenter", ...]: prefix that runs a command there
    c.mpirun_args(stack, hosts, np) -> argv of mpirun ("mpich"|"openmpi")
    c.mpi_env(stack) -> dict of environment for that stack across hosts
    c.processes(host) -> [pid] (root-namespace pids, holder init excluded)
    c.kill_all(host)  -> SIGKILL every process of that host except its init
    c.cross_host_unix_connections() -> [UnixLink]: connected Unix sockets
        whose two ends live in different hosts (or a host and the root)
    leftovers(cluster_id) -> [str]: anything of that cluster still present
By hand (from the repository root):
    python3 -m integration.cluster up [-n 4]    # prints the cluster id
    python3 -m integration.cluster run h1 -- hostname
    python3 -m integration.cluster shell h1
    python3 -m integration.cluster down
"""

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

STATE_ROOT = Path("/var/tmp/ckpt-cluster")   # shared fs, not per-host /tmp
MAX_ID = 200
NEEDED = ["ip", "nsenter", "unshare", "ss", "ssh", "ssh-keygen", "/usr/sbin/sshd"]


class ClusterUnavailable(Exception):
    """This machine cannot host a cluster (not root, no netns, ...)."""


def why_unavailable():
    """None if a cluster can be built here, else the reason."""
    if os.geteuid() != 0:
        return "the test cluster needs root (network namespaces)"
    for tool in NEEDED:
        if not shutil.which(tool):
            return f"the test cluster needs {tool} (setup.sh installs it)"
    probe = f"ckpt-probe-{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode:
        return f"network namespaces do not work here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _sh(*argv, check=True):
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


def _netns_name(cid, i):
    return f"ckpt{cid}-h{i}"


def _bridge_name(cid):
    return f"ckpt{cid}br"


def _netns_pids(netns):
    r = _sh("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in r.stdout.split()]


def _pidns_pids(init_pid):
    """Every process in the pid namespace whose init is init_pid."""
    try:
        ns = os.readlink(f"/proc/{init_pid}/ns/pid")
    except OSError:
        return []
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != init_pid:
            try:
                if os.readlink(f"/proc/{d}/ns/pid") == ns:
                    pids.append(int(d))
            except OSError:
                pass
    return pids


def kill_pids(pids, sig=signal.SIGKILL):
    """Signal every pid; one that is gone already is no error."""
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def _our_namespaces(cid):
    r = _sh("ip", "netns", "list", check=False)
    names = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(f"ckpt{cid}-h")]


def _our_links(cid):
    r = _sh("ip", "-o", "link", "show", check=False)
    links = []
    for line in r.stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name == _bridge_name(cid) or name.startswith(f"ckpt{cid}-h"):
            links.append(name)
    return links


def leftovers(cid):
    """What of cluster cid is still on the machine: namespaces, links, processes."""
    left = [f"netns {n}" for n in _our_namespaces(cid)]
    left += [f"link {n}" for n in _our_links(cid)]
    for n in _our_namespaces(cid):
        left += [f"process {p} in {n}" for p in _netns_pids(n)]
    return left


def _clean(cid):
    """Remove whatever cluster cid left (a crashed earlier run)."""
    for n in _our_namespaces(cid):
        for _ in range(50):
            pids = _netns_pids(n)
            if not pids:
                break
            kill_pids(pids)
            time.sleep(0.05)
        _sh("ip", "netns", "del", n, check=False)
    for link in _our_links(cid):
        _sh("ip", "link", "del", link, check=False)


@dataclass
class Host:
    name: str
    index: int
    address: str
    netns: str
    init_pid: int = 0
    holder_pid: int = 0     # `unshare`, the init's parent (in the netns too)
    holder: subprocess.Popen = None


@dataclass
class UnixLink:
    """A connected Unix socket whose peer lives in another host."""
    host: str            # where this end is ("root" for the root namespace)
    path: str
    inode: int
    process: str
    peer_host: str
    peer_inode: int

    def __str__(self):
        return (f"{self.host}:{self.process} inode {self.inode} ({self.path}) -> "
                f"{self.peer_host} inode {self.peer_inode}")


class Cluster:
    def __init__(self, n=4, detached=False):
        """n hosts h1..hn; detached: hosts outlive this process (`up`)."""
        if not 1 <= n <= 250:
            raise ValueError("a cluster has 1..250 hosts")
        self.n = n
        self.detached = detached
        self.id = None
        self.hosts = []
        self._lock = None

    # -- names --------------------------------------------------------------
    @property
    def names(self):
        return [h.name for h in self.hosts]

    @property
    def subnet(self):
        return f"198.18.{self.id}.0/24"

    @property
    def dir(self):
        return STATE_ROOT / str(self.id)

    @property
    def shared_dir(self):
        return self.dir / "shared"

    def host(self, name):
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name} in the cluster")

    def _h(self, host):
        return host if isinstance(host, Host) else self.host(host)

    # -- life cycle -----------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def _take_id(self):
        """The first id whose lock is free; its leftovers are stale: clean."""
        STATE_ROOT.mkdir(parents=True, exist_ok=True)
        for cid in range(MAX_ID):
            fd = os.open(STATE_ROOT / f"{cid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.id, self._lock = cid, fd
            _clean(cid)
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        raise ClusterUnavailable("no free cluster id (200 clusters running?)")

    def start(self):
        reason = why_unavailable()
        if reason:
            raise ClusterUnavailable(reason)
        self._take_id()
        try:
            self._write_files()
            self._network()
            for h in self.hosts:
                self._start_holder(h)
            for h in self.hosts:
                self._wait_ready(h)
        except BaseException:
            self.stop()
            raise
        return self

    def _write_files(self):
        d = self.dir
        (d / "shared").mkdir(parents=True)
        os.chmod(d / "shared", 0o1777)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "id_ed25519"))
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key"))
        shutil.copy(d / "id_ed25519.pub", d / "authorized_keys")
        self.hosts = [Host(f"h{i}", i, f"198.18.{self.id}.{i}", _netns_name(self.id, i))
                      for i in range(1, self.n + 1)]
        base = Path("/etc/hosts").read_text()
        (d / "hosts").write_text(base + "\n# ckpt test cluster\n" + "".join(
            f"{h.address} {h.name}\n" for h in self.hosts))
        (d / "ssh_config").write_text(
            "Host *\n"
            f"  IdentityFile {d}/id_ed25519\n"
            "  StrictHostKeyChecking no\n"
            "  UserKnownHostsFile /dev/null\n"
            "  GlobalKnownHostsFile /dev/null\n"
            "  LogLevel ERROR\n"
            "  BatchMode yes\n")
        (d / "sshd_config").write_text(
            f"HostKey {d}/host_key\n"
            f"AuthorizedKeysFile {d}/authorized_keys\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"       # the key lives under sticky /var/tmp
            "UseDNS no\n"
            "PidFile /run/sshd.pid\n"
            "LogLevel ERROR\n"
            "MaxStartups 100\n"
            "MaxSessions 100\n"
            # root's .bashrc here runs pyenv, whose rehash waits 60 s for
            # a lock a killed session left behind
            "SetEnv PYENV_REHASH_TIMEOUT=1\n")

    def _network(self):
        br = _bridge_name(self.id)
        _sh("ip", "link", "add", br, "type", "bridge")
        _sh("ip", "addr", "add", f"198.18.{self.id}.254/24", "dev", br)
        _sh("ip", "link", "set", br, "up")
        for h in self.hosts:
            _sh("ip", "netns", "add", h.netns)
            _sh("ip", "link", "add", h.netns, "type", "veth", "peer", "name", "eth0",
                "netns", h.netns)
            _sh("ip", "link", "set", h.netns, "master", br, "up")
            _sh("ip", "-n", h.netns, "addr", "add", f"{h.address}/24", "dev", "eth0")
            _sh("ip", "-n", h.netns, "link", "set", "eth0", "up")
            _sh("ip", "-n", h.netns, "link", "set", "lo", "up")

    def _start_holder(self, h):
        conf = {"name": h.name, "address": h.address, "dir": str(self.dir)}
        argv = ["nsenter", f"--net=/run/netns/{h.netns}",
                "unshare", "--uts", "--mount", "--ipc", "--pid", "--fork",
                "--kill-child", "--propagation", "private", "--mount-proc",
                sys.executable, os.path.abspath(__file__), "_init", json.dumps(conf)]

        def child():
            os.setsid()
            if not self.detached:       # the runner's death ends the host
                import ctypes
                ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
        log = open(self.dir / f"{h.name}.log", "wb")
        h.holder = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=log, preexec_fn=child,
                                    pass_fds=(self._lock,))
        h.holder_pid = h.holder.pid
        log.close()

    def _wait_ready(self, h, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if h.holder.poll() is not None:
                raise RuntimeError(f"host {h.name} did not start: "
                                   + (self.dir / f"{h.name}.log").read_text()[-500:])
            if not h.init_pid:
                try:
                    kids = Path(f"/proc/{h.holder.pid}/task/{h.holder.pid}/children").read_text()
                    h.init_pid = int(kids.split()[0]) if kids.split() else 0
                except OSError:
                    pass
            if h.init_pid and (self.dir / f"{h.name}.ready").exists():
                try:
                    socket.create_connection((h.address, 22), timeout=1).close()
                    return
                except OSError:
                    pass
            time.sleep(0.02)
        raise RuntimeError(f"host {h.name}: sshd did not come up in {timeout} s")

    def stop(self):
        """Kill every process of every host, remove namespaces and links."""
        if self.id is None:
            return
        for h in self.hosts:
            if h.init_pid:
                kill_pids(_pidns_pids(h.init_pid) + [h.init_pid])
            if h.holder:
                try:
                    h.holder.kill()
                except OSError:
                    pass
        for h in self.hosts:
            if h.holder:
                h.holder.wait()
            if h.init_pid:   # a subreaper runner (harness) inherits the init
                for _ in range(100):    # bounded: never hang a teardown
                    try:
                        if os.waitpid(h.init_pid, os.WNOHANG)[0]:
                            break
                    except ChildProcessError:
                        break
                    time.sleep(0.02)
        _clean(self.id)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.close(self._lock)
        self.id, self._lock, self.hosts = None, None, []

    @classmethod
    def attach(cls, cid):
        """A handle on the detached cluster cid (made by `up`)."""
        c = cls.__new__(cls)
        c.id, c.detached, c._lock = cid, True, None
        state = json.loads((STATE_ROOT / str(cid) / "state.json").read_text())
        c.hosts = [Host(**h) for h in state["hosts"]]
        c.n = len(c.hosts)
        return c

    def _save(self):
        (self.dir / "state.json").write_text(json.dumps({"hosts": [
            {"name": h.name, "index": h.index, "address": h.address,
             "netns": h.netns, "init_pid": h.init_pid, "holder_pid": h.holder_pid}
            for h in self.hosts]}))

    # -- running things on a host -------------------------------------------
    def enter_argv(self, host, cwd="/"):
        h = self._h(host)
        return ["nsenter", "-t", str(h.init_pid), "--net", "--uts", "--mount",
                "--ipc", "--pid", f"--wd={cwd}", "--"]

    def run(self, host, argv, cwd="/", **kw):
        return subprocess.run(self.enter_argv(host, cwd) + list(argv), **kw)

    def popen(self, host, argv, cwd="/", **kw):
        return subprocess.Popen(self.enter_argv(host, cwd) + list(argv), **kw)

    def processes(self, host):
        h = self._h(host)
        return sorted((set(_pidns_pids(h.init_pid)) | set(_netns_pids(h.netns)))
                      - {h.init_pid, h.holder_pid})

    def kill_all(self, host):
        """Every process of the host except its init (and holder) and sshd."""
        h = self._h(host)
        sshd = self._sshd_pid(h)
        for _ in range(50):
            pids = [p for p in self.processes(h) if p != sshd]
            if not pids:
                break
            kill_pids(pids)
            time.sleep(0.05)
        _drop_stale_rehash_lock()

    def _sshd_pid(self, h):
        try:
            kids = Path(f"/proc/{h.init_pid}/task/{h.init_pid}/children").read_text()
            return int(kids.split()[0])
        except (OSError, IndexError, ValueError):
            return 0

    # -- MPI --------------------------------------------------------------------
    def mpi_env(self, stack):
        """Environment that runs `stack` across hosts (besides os.environ)."""
        if stack == "mpich":
            # UCX's defaults pick shm within a host, tcp on eth0 across
            # hosts; UCX_NET_DEVICES=eth0 makes the job hang here.
            return {"HYDRA_LAUNCHER": "ssh"}
        if stack == "openmpi":
            return {"OMPI_MCA_btl_tcp_if_include": self.subnet,
                    "OMPI_MCA_oob_tcp_if_include": self.subnet,
                    "OMPI_MCA_plm_rsh_agent": "ssh"}
        raise ValueError(f"unknown MPI stack {stack}")

    def mpirun_args(self, stack, hosts, np):
        """mpirun argv placing np ranks evenly on hosts (run it on hosts[0])."""
        hosts = [self._h(x).name for x in hosts]
        if stack == "mpich":
            return ["mpirun.mpich", "-launcher", "ssh", "-hosts", ",".join(hosts),
                    "-np", str(np)]
        if stack == "openmpi":
            per = -(-np // len(hosts))
            return ["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe",
                    "--host", ",".join(f"{x}:{per}" for x in hosts), "-np", str(np),
                    "--mca", "btl_tcp_if_include", self.subnet,
                    "--mca", "oob_tcp_if_include", self.subnet]
        raise ValueError(f"unknown MPI stack {stack}")

    # -- isolation check ----------------------------------------------------------
    def cross_host_unix_connections(self):
        """Connected Unix sockets whose two ends live in different hosts.

        A connection's accepted end is created in the CONNECTING side's
        network namespace, so a socket that lives in one host's netns but is
        held by a process of another host (or whose peer inode is in another
        netns) is a link across hosts through the shared kernel."""
        pidns = {}
        for h in self.hosts:
            try:
                pidns[os.readlink(f"/proc/{h.init_pid}/ns/pid")] = h.name
            except OSError:
                pass

        def host_of(pid):
            try:
                return pidns.get(os.readlink(f"/proc/{pid}/ns/pid"), "root")
            except OSError:
                return None
        where, socks = {}, {}
        for h in self.hosts:
            r = _sh("nsenter", f"--net=/run/netns/{h.netns}", "ss", "-xapnH")
            socks[h.name] = _parse_ss(r.stdout)
        socks["root"] = _parse_ss(_sh("ss", "-xapnH").stdout)
        for name, entries in socks.items():
            for _, ino, _, _ in entries:
                where.setdefault(ino, name)
        links = []
        for name, entries in socks.items():
            for path, ino, peer, proc in entries:
                if not peer:
                    continue
                owners = {host_of(int(p)) for p in re.findall(r"pid=(\d+)", proc)}
                for owner in owners - {name, None}:
                    if name != "root" or owner != "root":
                        links.append(UnixLink(owner, path, ino, proc, name, peer))
                if name != "root" and where.get(peer, "root") not in (name, "root"):
                    links.append(UnixLink(name, path, ino, proc, where[peer], peer))
        return links


def _parse_ss(text):
    """(path, inode, peer inode, process) per Unix socket of `ss -xapnH`."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 8 or not f[0].startswith("u_"):
            continue
        try:
            out.append((f[4], int(f[5]), int(f[7]), " ".join(f[8:])))
        except ValueError:
            continue
    return out


# -- the host's init (pid 1 of its pid namespace) ------------------------------
def _drop_stale_rehash_lock():
    """An ssh session's shell killed while pyenv (in root's .bashrc on these
    machines) rehashes leaves its lock behind, and every later session
    waits 60 s for it: remove it when no rehash runs."""
    lock = Path.home() / ".pyenv" / "shims" / ".pyenv-shim"
    if not lock.exists():
        return
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"pyenv-rehash" in cmdline.read_bytes():
                return
        except OSError:
            continue
    lock.unlink(missing_ok=True)


def _init(conf):
    conf = json.loads(conf)
    d = conf["dir"]
    socket.sethostname(conf["name"])
    # the checkout is on the shared filesystem: one under /tmp (a CI clone,
    # say) stays visible in the host's own /tmp
    repo = str(Path(__file__).resolve().parent.parent)
    keep = f"{d}/checkout-{conf['name']}"
    hidden = any(repo == p or repo.startswith(p + "/") for p in ("/tmp", "/dev/shm", "/run"))
    if hidden:
        os.makedirs(keep, exist_ok=True)
        subprocess.run(["mount", "--bind", repo, keep], check=True)
    for path, mode in (("/tmp", "1777"), ("/dev/shm", "1777"), ("/run", "755")):
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"mode={mode}", "tmpfs", path],
                       check=True)
    if hidden:
        os.makedirs(repo, exist_ok=True)
        subprocess.run(["mount", "--move", keep, repo], check=True)
    os.makedirs("/run/sshd", mode=0o755)
    for src, dst in ((f"{d}/hosts", "/etc/hosts"),
                     (f"{d}/ssh_config", "/etc/ssh/ssh_config")):
        subprocess.run(["mount", "--bind", src, dst], check=True)
    subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", f"{d}/sshd_config",
                      "-o", f"ListenAddress={conf['address']}"])
    Path(f"{d}/{conf['name']}.ready").touch()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:                     # reap: orphans of this host come to us
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(1)


def _main(argv):
    import argparse
    p = argparse.ArgumentParser(prog="python3 -m integration.cluster",
                                description="a multi-host test cluster on this machine")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a cluster (it stays up)")
    up.add_argument("-n", type=int, default=4)
    for name in ("down", "run", "shell", "status"):
        s = sub.add_parser(name)
        s.add_argument("--id", type=int, default=None,
                       help="cluster id (default: the only one up)")
        if name in ("run", "shell"):
            s.add_argument("host")
        if name == "run":
            s.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    try:
        if a.cmd == "up":
            t = time.monotonic()
            c = Cluster(a.n, detached=True).start()
            c._save()
            print(f"cluster {c.id} up in {time.monotonic() - t:.2f} s: "
                  + " ".join(f"{h.name}={h.address}" for h in c.hosts)
                  + f"; shared dir {c.shared_dir}")
            return 0
        cid = a.id if a.id is not None else _only_cluster()
        c = Cluster.attach(cid)
        if a.cmd == "down":
            t = time.monotonic()
            for h in c.hosts:
                kill_pids(_pidns_pids(h.init_pid) + [h.init_pid])
            time.sleep(0.1)
            _clean(cid)
            shutil.rmtree(c.dir, ignore_errors=True)
            print(f"cluster {cid} down in {time.monotonic() - t:.2f} s")
            return 0
        if a.cmd == "status":
            print("\n".join(f"{h.name} {h.address} {len(c.processes(h))} processes"
                            for h in c.hosts))
            return 0
        cmd = a.command[1:] if a.cmd == "run" and a.command[:1] == ["--"] else \
            (a.command if a.cmd == "run" else [os.environ.get("SHELL", "/bin/bash")])
        if not cmd:
            p.error("run: no command")
        return c.run(a.host, cmd, cwd=os.getcwd()).returncode
    except (ClusterUnavailable, RuntimeError, KeyError, FileNotFoundError) as e:
        print(f"cluster: {e}", file=sys.stderr)
        return 1


def _only_cluster():
    ids = sorted(int(p.parent.name) for p in STATE_ROOT.glob("*/state.json"))
    if len(ids) != 1:
        raise RuntimeError(f"{len(ids)} clusters up ({ids}): say which with --id")
    return ids[0]


if __name__ == "__main__":
    if sys.argv[1:2] == ["_init"]:
        _init(sys.argv[2])
    else:
        sys.exit(_main(sys.argv[1:]))
