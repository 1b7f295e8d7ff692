"""A fingerprint of what the kernel shows of a job's processes, taken from
outside them (issue 37, "a restore that proves itself").

Everything comes from /proc/<pid>/ of the processes and from kcmp(2): the
processes are parked (after WRITE at a checkpoint, after REFILL at a
restart) and nothing here runs inside them.  A fingerprint is a flat
mapping {item: value} per process, both strings, so that two of them
compare item by item and a difference reads as one line:
`process 1234: fd 4 flags: O_WRONLY|O_NONBLOCK at the checkpoint,
O_WRONLY after the restart`.

Identities are the job's own: pids and tids as the job's pid namespace
shows them (a restart keeps them, in a pid namespace of its own:
docs/DESIGN.md, "A restart", 4 and 7), open file descriptions as groups of
(pid, fd) that share one (kcmp KCMP_FILE), pipes and other objects as
groups of (pid, fd) that refer to the same inode.  What a restart changes
on purpose is left out, each with its reason where it is left out.
"""

import ctypes
import functools
import os
import platform
import re
import stat

FORMAT = 2   # 2: groups named by size and first member

# ---- kcmp(2) -------------------------------------------------------------

SYS_KCMP = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
KCMP_FILE = 0
_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def kcmp_file(pid1, fd1, pid2, fd2):
    """0: the same open file description; 1 or 2: an order between
    different ones; None: kcmp could not tell (an fd gone, no access)."""
    if SYS_KCMP is None:
        return None
    result = _syscall(ctypes.c_long(SYS_KCMP), ctypes.c_long(pid1), ctypes.c_long(pid2),
                      ctypes.c_long(KCMP_FILE), ctypes.c_ulong(fd1), ctypes.c_ulong(fd2))
    return None if result < 0 else int(result)


# ---- small readers -------------------------------------------------------


def _read(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "backslashreplace")


def _readlink(path):
    return os.readlink(path)


def _status(text):
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key] = value.strip()
    return fields


def _stat_fields(text):
    """/proc/<pid>/stat after the command name: field 3 (state) first."""
    return text.rsplit(")", 1)[1].split()


def _error(exc):
    return f"unreadable ({exc.strerror or exc})" if isinstance(exc, OSError) else f"unreadable ({exc})"


OPEN_FLAGS = [  # fdinfo flags are octal: f_flags, plus O_CLOEXEC from the fd table
    (0o2000, "O_APPEND"), (0o4000, "O_NONBLOCK"), (0o10000, "O_DSYNC"), (0o20000, "O_ASYNC"),
    (0o40000, "O_DIRECT"), (0o100000, "O_LARGEFILE"), (0o200000, "O_DIRECTORY"),
    (0o400000, "O_NOFOLLOW"), (0o1000000, "O_NOATIME"), (0o2000000, "O_CLOEXEC"),
    (0o4000000, "O_SYNC"), (0o10000000, "O_PATH"), (0o20000000, "O_TMPFILE"),
]
ACCESS = {0: "O_RDONLY", 1: "O_WRONLY", 2: "O_RDWR", 3: "O_ACCMODE"}


def describe_flags(octal):
    try:
        value = int(octal, 8)
    except ValueError:
        return octal
    names = [ACCESS[value & 3]]
    rest = value & ~3
    for bit, name in OPEN_FLAGS:
        if rest & bit:
            names.append(name)
            rest &= ~bit
    if rest:
        names.append(oct(rest))
    return "|".join(names)


def describe_sigset(hexmask):
    """A /proc status signal mask as the numbers of its signals."""
    try:
        value = int(hexmask, 16)
    except ValueError:
        return hexmask
    signals = [str(n + 1) for n in range(64) if value >> n & 1]
    return "{" + ",".join(signals) + "}"


# ---- namespaces: the job's pids --------------------------------------------


class PidView:
    """Pids as the job's pid namespace shows them.  /proc here shows the
    reader's namespace; a restarted job lives in one of its own, one level
    down (NSpid lists a process's pid at every level, outermost first)."""

    def __init__(self):
        self._levels = {}

    def ns_pids(self, real_pid):
        if real_pid not in self._levels:
            try:
                fields = _status(_read(f"/proc/{real_pid}/status"))
                self._levels[real_pid] = [int(p) for p in fields.get("NSpid", "").split()]
            except (OSError, ValueError):
                self._levels[real_pid] = []
        return self._levels[real_pid]

    def translate(self, real_pid, level):
        """real_pid (of this /proc) at namespace `level`, or None when that
        process is outside it or gone."""
        if real_pid == 0:
            return 0
        pids = self.ns_pids(real_pid)
        return pids[level] if len(pids) > level else None


# ---- sockets: what /proc/<pid>/net shows of them ----------------------------

UNIX_TYPES = {"0001": "stream", "0002": "dgram", "0005": "seqpacket"}
UNIX_STATES = {"01": "unconnected", "02": "connecting", "03": "connected", "04": "disconnecting"}
TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2",
              6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN",
              11: "CLOSING"}
AUTOBIND = re.compile(r"^@[0-9a-f]{5}$")


def _socket_table(real_pid):
    """{inode: description} of every socket of the process's network
    namespace.  Addresses and ports are left out: a restart may bind
    new ports when TIME_WAIT holds the old ones, and a job moved to
    other hosts has other addresses (docs/DESIGN.md, "A restart", 3)."""
    table = {}
    base = f"/proc/{real_pid}/net/"
    try:
        lines = _read(base + "unix").splitlines()[1:]
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if len(fields) < 7:
            continue
        kind = UNIX_TYPES.get(fields[4], fields[4])
        listening = int(fields[3], 16) & 0x10000
        state = "listening" if listening else UNIX_STATES.get(fields[5], fields[5])
        path = fields[7] if len(fields) > 7 else ""
        # an autobound name (@ and five hex digits) is the kernel's pick:
        # a restart autobinds again and gets another
        if AUTOBIND.match(path):
            path = "@autobound"
        table[fields[6]] = f"unix {kind} {state}" + (f" {path}" if path else "")
    for proto in ("tcp", "tcp6", "udp", "udp6", "udplite", "udplite6", "raw", "raw6"):
        try:
            lines = _read(base + proto).splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            state = int(fields[3], 16)
            if proto.startswith("tcp"):
                state_name = TCP_STATES.get(state, str(state))
                if state_name in ("FIN_WAIT1", "FIN_WAIT2"):
                    # shut down for writing: whether the peer's ACK of the FIN
                    # came yet (1 or 2) is timing, and a restart sends the FIN anew
                    state_name = "FIN_WAIT"
            else:  # a connected datagram socket is ESTABLISHED, else CLOSE
                state_name = "connected" if state == 1 else "unconnected"
            table[fields[9]] = f"{proto} {state_name}"
    for proto, inode_field in (("packet", 8), ("netlink", 8)):
        try:
            lines = _read(base + proto).splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > inode_field:
                table[fields[inode_field]] = proto
    return table


# ---- one fd ------------------------------------------------------------------

# fdinfo lines kept, by their key; the rest is left out below
FDINFO_LEFT_OUT = {
    # the mount's id: a restart runs in a mount namespace of its own,
    # whose mounts have other ids
    "mnt_id",
    # the inode number: pipes, sockets, memfds and files the restart makes
    # again are new inodes (which fds refer to the same inode is kept:
    # "same object")
    "ino",
    # the flags and position are items of their own
    "flags", "pos",
    # a timerfd's time left and expirations go on while the job is parked
    # and in the image (the restart re-arms it with what was left)
    "it_value", "ticks",
    # an eventfd's id is a kernel counter, new at every eventfd()
    "eventfd-id",
    # a pidfd's pid as this /proc shows it: translated to the job's
    # namespace in "pidfd" instead
    "Pid", "NSpid",
}


def _fdinfo(text):
    """(flags, pos, [kept lines]) of an fdinfo file."""
    flags = pos = ""
    kept = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "flags":
            flags = value
        elif key == "pos":
            pos = value
        elif key == "lock":
            kept.append("lock " + _lock_line(value))
        elif key == "tfd":
            kept.append("epoll " + _epoll_line(value))
        elif key == "inotify":
            kept.append("inotify " + _drop_words(value, ("ino", "sdev")))
        elif key == "fanotify":
            kept.append("fanotify " + _drop_words(value, ("ino", "sdev")))
        elif key not in FDINFO_LEFT_OUT:
            kept.append(f"{key} {value}")
    return flags, pos, kept


def _drop_words(value, keys):
    """Leave out `key:value` words of an fdinfo line: inode and device
    numbers (a restart makes tmpfs files, pipes and sockets again, which
    are new inodes of other devices' numbers)."""
    return " ".join(w for w in value.split() if w.split(":", 1)[0] not in keys)


def _epoll_line(value):
    # an epoll entry's target fd, events and data are the program's; the
    # target's inode and device (`ino`, `sdev`) and its file position are not
    return _drop_words(value, ("ino", "sdev", "pos"))


def _lock_line(value):
    """`1: POSIX ADVISORY WRITE 1234 00:2a:5678 0 EOF`: kind, mode and range.
    The lock's number in the global list, its holder's pid (in this
    /proc's namespace) and the file's device and inode are left out: the
    fd the lock is shown on names the file."""
    words = value.split()
    if len(words) >= 7:
        return " ".join(words[1:4] + words[6:])
    return value


class FdFacts:
    """What one fd shows, before the job-wide groups are known."""

    def __init__(self, pid, real_pid, fd):
        self.pid, self.real_pid, self.fd = pid, real_pid, fd
        self.key = None          # (st_dev, st_ino): candidates for sharing
        self.terminal = False
        self.items = {}


def _fd_kind(link, st, sockets):
    if link.startswith("socket:["):
        return "socket " + sockets.get(link[8:-1], "(not in /proc/net)")
    if link.startswith("pipe:["):
        return "pipe"
    if link.startswith("anon_inode:"):
        # [eventfd], [eventpoll], [timerfd], [signalfd], inotify, [pidfd]...
        return link
    mode = st.st_mode if st is not None else 0
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISCHR(mode):
        return f"character device {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    if stat.S_ISBLK(mode):
        return f"block device {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISSOCK(mode):
        return "socket"
    return f"mode {mode:o}"


def _fd_facts(pid, real_pid, fd, sockets, pids, level):
    facts = FdFacts(pid, real_pid, fd)
    base = f"/proc/{real_pid}"
    try:
        link = _readlink(f"{base}/fd/{fd}")
    except OSError as exc:
        facts.items["kind"] = _error(exc)
        return facts
    try:
        st = os.stat(f"{base}/fd/{fd}")
    except OSError:
        st = None  # an O_PATH fd of a symlink, a file of a gone mount
    kind = _fd_kind(link, st, sockets)
    facts.terminal = _is_terminal(st)
    facts.items["kind"] = kind
    if not link.startswith(("socket:[", "pipe:[", "anon_inode:")):
        facts.items["path"] = link
    if st is not None and not link.startswith("anon_inode:"):
        # every anon_inode file of the kernel is the one anon inode: no object
        facts.key = (st.st_dev, st.st_ino)
    try:
        flags, pos, kept = _fdinfo(_read(f"{base}/fdinfo/{fd}"))
    except OSError as exc:
        facts.items["flags"] = _error(exc)
        return facts
    facts.items["flags"] = describe_flags(flags)
    facts.items["position"] = pos
    grouped = {}
    for line in kept:
        key, _, value = line.partition(" ")
        grouped.setdefault(f"fdinfo {key}", []).append(value)
    for name, values in grouped.items():
        # sorted: the kernel lists an epoll's interest list in the order of
        # its tree, keyed by the targets' file addresses, and inotify watches
        # and locks in orders of its own; the set is what the program made
        facts.items[name] = "; ".join(sorted(values))
    if link == "anon_inode:[pidfd]":
        try:
            fields = _status(_read(f"{base}/fdinfo/{fd}"))
            target = int(fields.get("Pid", "0"))
            if target > 0:
                translated = pids.translate(target, level)
                facts.items["pidfd"] = f"pid {translated}" if translated is not None else "outside the job's namespace"
            else:
                facts.items["pidfd"] = "exited" if target == -1 else str(target)
        except (OSError, ValueError):
            pass
    return facts


def _groups(all_facts, launcher_fds):
    """Fill in, for each fd, which other fds of the job (this host's) share
    its open file description ("shared with") and which refer to the same
    object but through other open file descriptions ("same object as")."""
    by_key = {}
    for facts in all_facts:
        if facts.key is not None:
            by_key.setdefault(facts.key, []).append(facts)
    for members in by_key.values():
        if len(members) > 1:
            def compare(a, b):
                result = kcmp_file(a.real_pid, a.fd, b.real_pid, b.fd)
                return 0 if result in (0, None) else (-1 if result == 1 else 1)
            members.sort(key=functools.cmp_to_key(compare))
            descriptions, current = [], [members[0]]
            for prev, facts in zip(members, members[1:]):
                if kcmp_file(prev.real_pid, prev.fd, facts.real_pid, facts.fd) == 0:
                    current.append(facts)
                else:
                    descriptions.append(current)
                    current = [facts]
            descriptions.append(current)
        else:
            descriptions = [members]
        # a group is named by its size and its first member, the same words
        # for every member: as exact as listing the others (the first member
        # tells the groups apart), and linear in the job, not quadratic when
        # every rank shares the same stdout
        for ofd in descriptions:
            if len(ofd) > 1:
                name = _group_name(len(ofd), "fds", ofd)
                for facts in ofd:
                    facts.items["shared with"] = name
        if len(descriptions) > 1:
            name = _group_name(len(descriptions), "open file descriptions", members)
            for facts in members:
                facts.items["same object as"] = name
    for facts in all_facts:
        if facts.key is not None and "position" in facts.items and any(
                kcmp_file(os.getpid(), own, facts.real_pid, facts.fd) == 0 for own in launcher_fds):
            # one open file description with our own stdio (the launcher's,
            # at a restart the restarter's): we write through it too (this
            # checkpoint's warnings, after the image took its offset), and a
            # restart gives the restarter's or reopens it
            facts.items["position"] = LAUNCHERS_POSITION
    for facts in all_facts:
        # a terminal from outside the job (the launcher's, at a restart the
        # restarter's: a restart may run on another terminal) is named as
        # such, not by its device number
        if facts.terminal:
            for own in launcher_fds:  # (our own stdio: the launcher's, the restarter's)
                if kcmp_file(os.getpid(), own, facts.real_pid, facts.fd) == 0:
                    facts.items["kind"] = "the launcher's terminal"
                    facts.items.pop("path", None)
                    break


def _is_terminal(st):
    """A terminal device: ttys, consoles and /dev/tty (majors 4 and 5), ptys
    (136-143)."""
    if st is None or not stat.S_ISCHR(st.st_mode):
        return False
    major = os.major(st.st_rdev)
    return major in (4, 5) or 136 <= major <= 143


def _group_name(count, what, members):
    pid, fd = min((f.pid, f.fd) for f in members)
    return f"{count} {what}, the first {pid}:{fd}"


# ---- one process -------------------------------------------------------------

STATUS_PROCESS = ("Umask", "ShdPnd", "SigIgn", "SigCgt", "NoNewPrivs", "Seccomp",
                  "Seccomp_filters", "CoreDumping", "THP_enabled", "Speculation_Store_Bypass",
                  "SpeculationIndirectBranch")
STATUS_THREAD = ("Name", "Uid", "Gid", "Groups", "SigPnd", "SigBlk", "CapInh", "CapPrm",
                 "CapEff", "CapBnd", "CapAmb")
SIGNAL_MASKS = ("ShdPnd", "SigIgn", "SigCgt", "SigPnd", "SigBlk")
# /proc/<pid>/stat fields (1-based, as proc(5) numbers them) of the memory
# layout, which a restart gives back with PR_SET_MM_MAP
STAT_LAYOUT = {26: "start_code", 27: "end_code", 28: "start_stack", 45: "start_data",
               46: "end_data", 47: "start_brk", 48: "arg_start", 49: "arg_end",
               50: "env_start", 51: "env_end"}
CHECKPOINT_THREAD = "ckpt"
# read where /proc lets us: compared only when both sides could read them
# (reading another process's timerslack_ns takes CAP_SYS_NICE, which an
# unprivileged restart's coordinator has over its own user namespace's
# processes and not over the launched job's)
OPTIONAL = ("oom_score_adj", "personality", "loginuid", "timerslack_ns")  # the shim's checkpoint thread's name (PR_SET_NAME)


def _own_tty():
    try:
        return int(_stat_fields(_read("/proc/self/stat"))[4])
    except (OSError, ValueError, IndexError):
        return 0


def _process_items(pid, real_pid, pids, own_tty):
    items = {}
    base = f"/proc/{real_pid}"
    try:
        status = _status(_read(f"{base}/status"))
        stat_fields = _stat_fields(_read(f"{base}/stat"))
    except OSError as exc:
        return {"process": _error(exc)}, 0, 0
    ns = [int(p) for p in status.get("NSpid", str(real_pid)).split()]
    level = len(ns) - 1
    ppid = int(stat_fields[1])
    parent = pids.translate(ppid, level)
    items["parent"] = str(parent) if parent is not None else "outside the job's namespace"
    items["process group"] = status.get("NSpgid", "").split()[-1:][0] if status.get("NSpgid") else "?"
    items["session"] = status.get("NSsid", "").split()[-1:][0] if status.get("NSsid") else "?"
    tty = int(stat_fields[4])
    if tty == 0:
        items["controlling terminal"] = "none"
    elif tty == own_tty:
        # the launcher's terminal (a restart's: the restarter's, which may be another)
        items["controlling terminal"] = "the launcher's terminal"
    else:
        items["controlling terminal"] = f"{os.major(tty)}:{os.minor(tty)}"
        tpgid = int(stat_fields[5])
        if tpgid > 0:
            fg = pids.translate(tpgid, level)
            items["foreground group"] = str(fg) if fg is not None else "outside"
    # the process's state (stat's third field) is left out: parked, every
    # process sleeps; a stopped one is traced at a checkpoint ("t") and
    # stops itself again only after RESUME at a restart
    items["nice"] = stat_fields[16]
    items["threads"] = status.get("Threads", "?")
    for number, name in STAT_LAYOUT.items():
        if len(stat_fields) > number - 3:
            items[f"layout {name}"] = hex(int(stat_fields[number - 3]))
    dropped = _dropped_on_delivery(status) | _timer_signals(base)
    for key in STATUS_PROCESS:
        if key in status:
            value = status[key]
            if key == "ShdPnd":
                value = _without(value, dropped)
            items[key] = describe_sigset(value) if key in SIGNAL_MASKS else value
    for name, path in (("cwd", "cwd"), ("root", "root"), ("executable", "exe")):
        try:
            items[name] = _readlink(f"{base}/{path}")
        except OSError as exc:
            items[name] = _error(exc)
    try:
        for line in _read(f"{base}/limits").splitlines()[1:]:
            # "Max open files            1024                 1048576              files"
            parts = re.split(r"\s{2,}", line.strip())
            if len(parts) >= 3:
                items[f"limit {parts[0]}"] = f"{parts[1]} {parts[2]}"
    except OSError as exc:
        items["limits"] = _error(exc)
    for name in OPTIONAL:
        try:
            items[name] = _read(f"{base}/{name}").strip()
        except OSError:
            pass  # a kernel without it, or no access: not shown either way
    try:
        auxv = _read_bytes(f"{base}/auxv")
        items["auxv"] = auxv.hex()
    except OSError:
        pass
    return items, level, dropped


# signals whose default action is to ignore them: SIGCHLD, SIGURG, SIGWINCH
IGNORED_BY_DEFAULT = (1 << 16) | (1 << 22) | (1 << 27)


def _dropped_on_delivery(status):
    """The signals a pending set may hold that nobody will ever see: ignored
    (SIG_IGN, or SIG_DFL of one whose default is to ignore).  The kernel
    drops them as they are generated unless blocked; a restart blocks every
    signal until its threads are back, so a child it recreates that ends
    then (a stand-in, a daemon's middle process) leaves a SIGCHLD pending
    that the checkpoint never had, and that the kernel drops unseen."""
    try:
        ignored = int(status.get("SigIgn", "0"), 16)
        caught = int(status.get("SigCgt", "0"), 16)
    except ValueError:
        return 0
    return ignored | (IGNORED_BY_DEFAULT & ~caught)


ITIMER_SIGNALS = (1 << 13) | (1 << 25) | (1 << 26)  # SIGALRM, SIGVTALRM, SIGPROF


def _timer_signals(base):
    """The signals the process's timers send (POSIX timers from
    /proc/<pid>/timers; the itimers', which /proc does not show, always).
    A timer goes on while the job is parked, so its signal may become
    pending after the image was taken, and a restored timer (re-armed with
    what it had left) may fire before RESUME: whether one is pending at
    either moment is timing, and left out of the pending sets."""
    mask = ITIMER_SIGNALS
    try:
        for line in _read(f"{base}/timers").splitlines():
            if line.startswith("signal:"):
                number = int(line.split(":", 1)[1].strip().split("/", 1)[0])
                if 1 <= number <= 64:
                    mask |= 1 << (number - 1)
    except (OSError, ValueError):
        pass
    return mask


def _without(hexmask, dropped):
    try:
        return f"{int(hexmask, 16) & ~dropped:016x}"
    except ValueError:
        return hexmask


def _read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def _thread_items(real_pid, pids, level, dropped=0):
    items = {}
    tids = []
    try:
        tasks = sorted(int(t) for t in os.listdir(f"/proc/{real_pid}/task"))
    except OSError as exc:
        return {"threads list": _error(exc)}
    for tid in tasks:
        base = f"/proc/{real_pid}/task/{tid}"
        try:
            status = _status(_read(f"{base}/status"))
            fields = _stat_fields(_read(f"{base}/stat"))
        except OSError:
            continue  # a thread that ended meanwhile
        if status.get("Name") == CHECKPOINT_THREAD:
            # the shim's own thread: it runs (talks to the coordinator) while
            # the application's threads are parked, at a checkpoint and at a
            # restart alike; its mask and state are the shim's
            continue
        ns = status.get("NSpid", str(tid)).split()
        vtid = ns[level] if len(ns) > level else ns[-1]
        tids.append(vtid)
        prefix = f"thread {vtid}"
        for key in STATUS_THREAD:
            if key in status:
                value = status[key]
                if key == "SigPnd":
                    value = _without(value, dropped)
                items[f"{prefix} {key}"] = describe_sigset(value) if key in SIGNAL_MASKS else value
        items[f"{prefix} nice"] = fields[16]
        if len(fields) > 38:
            items[f"{prefix} policy"] = f"{fields[38]} priority {fields[37]}"
    items["thread ids"] = " ".join(tids)
    return items


# ---- mappings -------------------------------------------------------------------

RESERVE = (0x7f000000, 0xff000000)  # CKPT_RESERVE_START, _END (native/include)
VDSO_NAMES = ("[vdso]", "[vvar]", "[vvar_vclock]", "[vsyscall]")
SMAPS_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) ([0-9a-f]+) \S+ \d+ ?(.*)$")


def _map_items(real_pid):
    """One item per mapping: `map <start>-<end>` -> protections and
    private/shared, offset, backing file, VmFlags; and per unlinked file
    mapped privately, how much of it the process holds as its own
    copies."""
    items = {}
    try:
        text = _read(f"/proc/{real_pid}/smaps")
    except OSError as exc:
        return {"maps": _error(exc)}
    current, reserve = None, False
    spans = {}
    copies, copied_file = {}, None
    for line in text.splitlines():
        match = SMAPS_HEADER.match(line)
        if match:
            start, end, perms, offset, path = match.groups()
            path = path.strip()
            copied_file = path if perms[3] == "p" and _unlinked_file(path) else None
            # the device and inode numbers of a map's file are left out: a
            # restart makes memfds, deleted files and scratch files again
            # (new inodes, and tmpfs devices whose numbers differ); the
            # file is named by its path
            if path in VDSO_NAMES:
                # the new kernel's vDSO and its data pages: the restart moves
                # them onto the saved addresses, but their size and layout
                # are the running kernel's
                current = f"map {path}"
                items[current] = perms
                continue
            current = f"map {start}-{end}"
            reserve = (int(start, 16), int(end, 16)) == RESERVE
            shown_offset = "" if not path or path.startswith("[") else f" at {int(offset, 16):#x}"
            items[current] = f"{perms}{shown_offset}" + (f" {path}" if path else "")
            spans[current] = (int(start, 16), int(end, 16), int(offset, 16), perms, path)
        elif copied_file is not None and line.startswith(("Anonymous:", "Swap:")):
            copies[copied_file] = copies.get(copied_file, 0) + int(line.split()[1])
        elif line.startswith("VmFlags:") and current is not None:
            # um/uw/ui: registered with a userfaultfd: a lazy restart's
            # page server (ckpt restart --lazy) until its last page is in
            flags = [f for f in line.split(":", 1)[1].split() if f not in ("um", "uw", "ui")]
            if not current.startswith("map ["):
                if reserve:
                    # the shim's reserved range (PROT_NONE, never saved): a
                    # restart maps it again once the program's own
                    # mlockall(MCL_FUTURE) is back, which locks it (on fault)
                    flags = [f for f in flags if f not in ("lo", "lf")]
                items[current] += " [" + " ".join(_vmflags(flags)) + "]"
    merged = _merged(items, spans)
    for path, kb in sorted(copies.items()):
        # the pages the process wrote (copied on write: anonymous, in
        # memory or swapped); the others are the file's, and must stay
        # so (issue 37, shape 5), not come back as copies that no later
        # write to the file reaches.  Only unlinked files: a library's
        # private pages are written by the checkpointer's own code too
        merged[f"private copies of {path}"] = f"{kb} kB"
    return merged


def _unlinked_file(path):
    """A file's name as maps show it once unlinked (a memfd's too), not
    shared anonymous memory's "/dev/zero (deleted)"."""
    return path.startswith("/") and path.endswith(" (deleted)") and path != "/dev/zero (deleted)"


def _merged(items, spans):
    """Adjacent maps that are alike as one (anonymous ones, or a file's at
    contiguous offsets, with the same protections, flags and VmFlags).
    Whether the kernel merged two such regions depends on their history
    (anon_vma: a fork, a region written before its neighbour was mapped),
    which a restore does not repeat: it maps them afresh, and merged."""
    merged, last = {}, None
    for key, value in items.items():
        span = spans.get(key)
        if span is not None and last is not None:
            start, end, offset, perms, path = span
            l_key, (l_start, l_end, l_offset, l_perms, l_path), l_value = last
            contiguous = not path or path.startswith("[") or offset == l_offset + (l_end - l_start)
            if start == l_end and perms == l_perms and path == l_path and contiguous and \
                    _without_offset(value) == _without_offset(l_value) and \
                    not (RESERVE[0] <= start < RESERVE[1]):
                del merged[l_key]
                key = f"map {l_start:x}-{end:x}"
                span = (l_start, end, l_offset, perms, path)
                value = l_value
        merged[key] = value
        last = (key, span, value) if span is not None else None
    return merged


def _without_offset(value):
    return re.sub(r" at 0x[0-9a-f]+", "", value)


VMFLAGS_LEFT_OUT = {
    # soft-dirty: whether the map was written since soft-dirty bits were
    # last cleared, which every new mapping starts with: the kernel's
    # bookkeeping, not the process's state
    "sd",
    # VM_ACCOUNT: whether the map was charged to the commit limit, which
    # depends on whether it was ever private and writable, not on what it
    # is: a restore maps a private region writable to fill it, then
    # protects it as it was
    "ac",
}


def _vmflags(flags):
    return [f for f in flags if f not in VMFLAGS_LEFT_OUT]


# ---- the whole host -----------------------------------------------------------


def take(processes):
    """Fingerprints of a host's processes of the job, parked.

    processes: [(pid in the job's namespace, pid in this /proc)].  Returns
    {str(pid): {item: value}}."""
    pids = PidView()
    own_tty = _own_tty()
    result = {}
    all_fds = []
    socket_tables = {}
    for pid, real_pid in processes:
        items, level, dropped = _process_items(pid, real_pid, pids, own_tty)
        items.update(_thread_items(real_pid, pids, level, dropped))
        try:
            netns = os.stat(f"/proc/{real_pid}/ns/net").st_ino
        except OSError:
            netns = None
        if netns not in socket_tables:
            socket_tables[netns] = _socket_table(real_pid)
        try:
            fds = sorted(int(fd) for fd in os.listdir(f"/proc/{real_pid}/fd"))
        except OSError as exc:
            items["fds"] = _error(exc)
            fds = []
        else:
            items["fds"] = " ".join(map(str, fds))
        facts = [_fd_facts(pid, real_pid, fd, socket_tables[netns], pids, level) for fd in fds]
        all_fds.extend(facts)
        items.update(_map_items(real_pid))
        result[str(pid)] = items
    _groups(all_fds, launcher_fds=(0, 1, 2))
    for facts in all_fds:
        items = result[str(facts.pid)]
        for key, value in facts.items.items():
            items[f"fd {facts.fd} {key}"] = value
    _number_ptys(result)
    return result


PTS_KIND = re.compile(r"^character device (13[6-9]|14[0-3]):(\d+)$")
PTS_PATH = re.compile(r"^/dev/pts/(\d+)$")
PTS_TTY = re.compile(r"^(13[6-9]|14[0-3]):(\d+)$")


def _number_ptys(result):
    """Pty numbers as the job's own: the first pty seen is pty 1, and so on
    (processes by pid, items in order).  A restart opens its ptys anew from
    /dev/ptmx and gets the numbers free then (another program may hold the
    old one), as it gets new inode numbers; which fds, masters and
    controlling terminals are one pty is kept."""
    numbers = {}

    def ours(number):
        return f"pty {numbers.setdefault(number, len(numbers) + 1)}"

    for pid in sorted(result, key=int):
        items = result[pid]
        for key, value in items.items():
            if key == "controlling terminal" and PTS_TTY.match(value):
                major, minor = map(int, value.split(":"))
                items[key] = ours((major - 136) * 256 + minor)
            elif key.endswith(" kind") and PTS_KIND.match(value):
                major, minor = map(int, PTS_KIND.match(value).groups())
                items[key] = "pty slave " + ours((major - 136) * 256 + minor)
            elif key.endswith(" path") and PTS_PATH.match(value):
                items[key] = "/dev/pts/(" + ours(int(PTS_PATH.match(value).group(1))) + ")"
            elif key.endswith(" fdinfo tty-index") and value.isdigit():
                items[key] = ours(int(value))


# ---- comparing -----------------------------------------------------------------

ABSENT = "absent"


def compare(before, after):
    """[(pid, item, value at the checkpoint, value after the restart)] of
    two fingerprints (of take()), in a stable order: processes by pid,
    then items as the checkpoint listed them, then the restart's extras."""
    differences = []
    pids = sorted(set(before) | set(after), key=lambda p: (len(p), p))
    for pid in pids:
        old, new = before.get(pid), after.get(pid)
        if old is None or new is None:
            differences.append((pid, "process", "present" if old is not None else ABSENT,
                                "present" if new is not None else ABSENT))
            continue
        for item, value in old.items():
            if item in OPTIONAL and item not in new:
                continue
            if not _same(item, value, new.get(item, ABSENT)) and \
                    not _scratch(item, value, new.get(item, ABSENT)):
                differences.append((pid, item, value, new.get(item, ABSENT)))
        for item, value in new.items():
            if item not in old and item not in OPTIONAL:
                differences.append((pid, item, ABSENT, value))
    # per process, what an fd is before whom it shares with: the first
    # difference is the one a failed restart names
    order = {pid: n for n, pid in enumerate(pids)}
    return sorted(differences, key=lambda d: (order[d[0]], d[1].endswith(GROUP_ITEMS)))


GROUP_ITEMS = ("shared with", "same object as")


LAUNCHERS_POSITION = "moved by the launcher too"


def _same(item, old, new):
    if old == new:
        return True
    if item.endswith(" position") and LAUNCHERS_POSITION in (old, new):
        return True
    if item.startswith("map "):
        # VM_NORESERVE ("nr", MAP_NORESERVE) only says that the map is not
        # charged to the commit limit (glibc's thread arenas are made so): a
        # restore maps regions without it.  Kept in the record: it tells
        # the shim's scratch buffers (below) from a restored map
        return _NORESERVE.sub("", old) == _NORESERVE.sub("", new)
    return False


_NORESERVE = re.compile(r" nr\b")
SCRATCH = re.compile(r"^rw-p \[[^]]*\bnr\b[^]]*\]$")


def _scratch(item, old, new):
    """A private anonymous MAP_NORESERVE map that only the checkpoint shows:
    the checkpoint thread's scratch buffers (native/shim/scratch.c), mapped
    for one checkpoint and never part of the image.  Nothing outside the
    shim tells them apart from a program's own."""
    return new == ABSENT and item.startswith("map ") and SCRATCH.match(old) is not None


def describe(difference):
    pid, item, old, new = difference
    return f"process {pid}: {item}: {old or '(empty)'} at the checkpoint, {new or '(empty)'} after the restart"
