/*
 * ckpt process image format (docs/IMAGE.md).
 *
 * One file per process: a 4 KiB header, then a stream of records, each a
 * struct ckpt_record followed by its payload, ended by CKPT_REC_END.  Page
 * data of a memory region sits page-aligned inside its record so restart
 * can read() it straight into the mapped region.  The file's checksum is
 * kept in the checkpoint's manifest.yaml: the XXH3-64 of the XXH3-64s
 * (little-endian) of its CKPT_CHECKSUM_BLOCK-byte blocks, so that many
 * CPUs can check one image.  The header has its own.
 *
 * Python reads the block between the cffi markers with cffi, so keep it to
 * plain fixed-size types there.
 */
#ifndef CKPT_IMAGE_H
#define CKPT_IMAGE_H

#include <stdint.h>

/* cffi:begin */
#define CKPT_IMAGE_MAGIC 0x31474d4954504b43	/* "CKPTIMG1" little-endian */
#define CKPT_IMAGE_VERSION 20
#define CKPT_CHECKSUM_BLOCK 4194304		/* 4 MiB: what a lazy page waits for */
#define CKPT_ARCH_X86_64 62			/* ELF e_machine */
#define CKPT_HEADER_SIZE 4096
#define CKPT_PAGE_SIZE 4096
#define CKPT_MAX_GROUPS 64

/* Address range the shim keeps PROT_NONE in every process, never saved:
 * ckpt-restart is linked inside it so it never collides with an image.
 * Its start is below 2 GiB (a static non-PIE binary must be) and above
 * all but the last 16 MiB of the MAP_32BIT window; 2 GiB, because the
 * kernel places ckpt-restart's brk up to 1 GiB after its end. */
#define CKPT_RESERVE_START 0x7f000000
#define CKPT_RESERVE_SIZE 0x80000000

struct ckpt_image_header {
	uint64_t magic;
	uint32_t format_version;
	uint32_t arch;
	uint32_t page_size;
	uint32_t header_size;
	char engine_version[32];
	char hostname[64];
	int32_t pid;			/* as seen inside the process */
	int32_t nthreads;
	uint64_t restart_info;		/* address of the shim's ckpt_restart_info */
	uint64_t reserve_start;
	uint64_t reserve_end;
	int64_t time_ns;		/* CLOCK_REALTIME at write */
	uint64_t header_xxh;		/* XXH3-64 of this struct, this field 0 */
};

enum ckpt_record_type {
	CKPT_REC_PROCESS = 1,
	CKPT_REC_THREAD = 2,
	CKPT_REC_VMA = 3,
	CKPT_REC_FD = 4,
	CKPT_REC_PLUGIN = 5,
	CKPT_REC_END = 6,
	CKPT_REC_SYSV_SEM = 7,		/* struct ckpt_sysv_sem, its values */
	CKPT_REC_SYSV_MSG = 8,		/* struct ckpt_sysv_msg, its messages */
	CKPT_REC_MQUEUE = 9,		/* a POSIX message queue no fd holds, that
					 * the process created: laid out as a
					 * CKPT_REC_FD of kind CKPT_FD_MQUEUE,
					 * fd -1 */
	CKPT_REC_SIGNALS = 10,		/* struct ckpt_signal_queue, its siginfos */
	CKPT_REC_SOURCES = 11,		/* struct ckpt_source[]: the earlier images
					 * an incremental image's pages refer to */
	CKPT_REC_AIO_REQUESTS = 12,	/* struct ckpt_aio_request[]: kernel AIO
					 * requests submitted, not reaped */
	CKPT_REC_EXE = 13,		/* the executable when no name reaches it
					 * (deleted, or a memfd run by fexecve):
					 * laid out as a CKPT_REC_FD of kind
					 * CKPT_FD_DELETED_FILE, fd -1, its bytes */
	CKPT_REC_FILE_PAGES = 14	/* the pages of an unlinked file (or memfd)
					 * under a private map of it that nothing
					 * else brings back (no fd of the process,
					 * no shared map of that range): laid out as
					 * a CKPT_REC_VMA of kind
					 * CKPT_VMA_DELETED_FILE over the map's range,
					 * whose runs are the file's pages there (not
					 * copied on write), no guards, no refs.  The
					 * restart makes the file from them, once
					 * for the job, under every map of it */
};
#define CKPT_REC_LAST 14		/* the highest record type */

struct ckpt_record {
	uint32_t type;
	uint32_t pad;
	uint64_t size;			/* payload bytes after this struct */
};

enum ckpt_vma_kind {
	CKPT_VMA_ANON = 1,		/* private anonymous: saved pages */
	CKPT_VMA_FILE = 2,		/* private file: remapped, dirty pages saved */
	CKPT_VMA_SHARED_FILE = 3,	/* shared file mapping: remapped, no data */
	CKPT_VMA_SHARED_ANON = 4,	/* shared anonymous: saved pages */
	CKPT_VMA_HEAP = 5,		/* [heap]: anonymous, saved pages */
	CKPT_VMA_STACK = 6,		/* [stack]: anonymous, grows down */
	CKPT_VMA_VDSO = 7,		/* [vvar] [vvar_vclock] [vdso]: moved, no data */
	CKPT_VMA_DELETED_FILE = 8,	/* private map of an unlinked file: the pages
					 * copied on write saved; the file's with
					 * it, or as CKPT_REC_FILE_PAGES */
	CKPT_VMA_SHARED_MEMFILE = 9,	/* shared map of a file in memory (/dev/shm):
					 * saved pages, the file rewritten at restart */
	CKPT_VMA_SYSV_SHM = 10,		/* System V shared memory: saved pages, the
					 * segment made again with its id */
	CKPT_VMA_AIO_RING = 11		/* a kernel AIO context's ring (io_setup):
					 * saved pages; the context made again
					 * there, with its completed events */
};

struct ckpt_vma {
	uint64_t start;
	uint64_t end;
	uint64_t pgoff;			/* file offset of a file mapping */
	uint32_t prot;			/* PROT_* */
	uint32_t shared;		/* 1 = MAP_SHARED */
	uint32_t kind;			/* enum ckpt_vma_kind */
	uint32_t path_len;		/* bytes of path after this struct */
	uint64_t nruns;			/* struct ckpt_run after the path */
	uint64_t data_offset;		/* file offset of the first saved page */
	uint64_t data_size;
	uint64_t file_size;		/* identity of a mapped file */
	int64_t file_mtime_ns;
	uint64_t shm_id;		/* shared memory object (inode): pairs its
					 * mappings, across processes too */
	int32_t sysv_id;		/* CKPT_VMA_SYSV_SHM: shmid, key, mode */
	int32_t sysv_key;
	uint32_t sysv_mode;		/* permissions, SHM_DEST (removed, still attached) */
	uint32_t flags;			/* CKPT_VMA_PAGES_* */
	uint64_t sysv_size;
	uint64_t nguards;		/* struct ckpt_run after the runs: guard
					 * pages (MADV_GUARD_INSTALL), never read */
	uint32_t advice;		/* CKPT_ADVICE_*: locks and madvise() */
	uint32_t compression;		/* CKPT_COMPRESS_*: how the page data is stored */
	uint64_t stored_size;		/* bytes of page data in the file: data_size
					 * uncompressed, the chunks' sum compressed */
	uint64_t nrefs;			/* struct ckpt_page_ref after the chunks:
					 * pages held by earlier images */
};

/*
 * Compressed page data (compression CKPT_COMPRESS_ZSTD): the bytes of the
 * runs, in order, cut into CKPT_CHUNK_SIZE chunks (the last may be
 * shorter); a struct ckpt_chunk per chunk follows the guard pages, and the
 * chunks follow each other from data_offset on.  Each chunk is one zstd
 * frame with its content size and checksum, or raw when it did not shrink,
 * so the restart decompresses chunks in parallel, straight into place.
 */
#define CKPT_COMPRESS_NONE 0
#define CKPT_COMPRESS_ZSTD 1
#define CKPT_CHUNK_SIZE 1048576		/* 1 MiB */
#define CKPT_CHUNK_RAW 0
#define CKPT_CHUNK_ZSTD 1

struct ckpt_chunk {
	uint32_t stored;		/* bytes in the file */
	uint32_t format;		/* CKPT_CHUNK_RAW or CKPT_CHUNK_ZSTD */
};

/* The process's membarrier() registrations for private expedited
 * barriers (a command it did not register for fails with EPERM). */
#define CKPT_MEMBARRIER_PRIVATE_EXPEDITED 1
#define CKPT_MEMBARRIER_SYNC_CORE 2
#define CKPT_MEMBARRIER_RSEQ 4

/* What mlock() and madvise() told the kernel about a region (the VmFlags
 * of /proc/PID/smaps), given again at restart. */
#define CKPT_ADVICE_LOCKED 1		/* mlock (lo) */
#define CKPT_ADVICE_LOCKONFAULT 2	/* mlock2(MLOCK_ONFAULT) (lf) */
#define CKPT_ADVICE_DONTDUMP 4		/* MADV_DONTDUMP (dd) */
#define CKPT_ADVICE_DONTFORK 8		/* MADV_DONTFORK (dc) */
#define CKPT_ADVICE_WIPEONFORK 16	/* MADV_WIPEONFORK (wf) */
#define CKPT_ADVICE_HUGEPAGE 32		/* MADV_HUGEPAGE (hg) */
#define CKPT_ADVICE_NOHUGEPAGE 64	/* MADV_NOHUGEPAGE (nh) */
#define CKPT_ADVICE_MERGEABLE 128	/* MADV_MERGEABLE (mg) */
#define CKPT_ADVICE_SEQUENTIAL 256	/* MADV_SEQUENTIAL (sr) */
#define CKPT_ADVICE_RANDOM 512		/* MADV_RANDOM (rr) */
#define CKPT_ADVICE_DROPPABLE 1024	/* mapped MAP_DROPPABLE (dp): mmap's, not
					 * madvise's, given again by mapping so */

/* Shared memory mapped alike by several processes is saved by one: the
 * others' records say where its pages are. */
#define CKPT_VMA_PAGES_ELSEWHERE 1	/* in another image of the same host */
/* A private map of an unlinked file (or memfd), file_size bytes long (its
 * end, to a page): restored as a private map of the same object when an fd
 * or a shared map of the job brings it back (shm_id), else of a new memfd
 * of that size, so the map keeps its length and SIGBUS past the end. */
#define CKPT_VMA_FILE_END 2
/* With CKPT_VMA_FILE_END: the unlinked file comes back at restart (an fd
 * of the process holds it, a shared map of its range, or the file's pages
 * saved in CKPT_REC_FILE_PAGES records), so only the pages the process
 * copied on write are saved; the others are the file's, and stay so.  A
 * restart that cannot map the file fails. */
#define CKPT_VMA_FILE_PAGES 4

/* A run of saved pages; pages outside every run are zero (anonymous) or
 * come from the mapped file. */
struct ckpt_run {
	uint64_t offset;		/* bytes from vma start */
	uint64_t npages;
};

/*
 * Incremental checkpoints: a page unchanged since the previous checkpoint
 * (same address, same XXH3-128) is not written again; the record refers
 * to where an earlier image holds it.  Pages of an earlier image are raw
 * (stored 0: len bytes at off) or inside one of its zstd chunks (off and
 * stored: the chunk in the file, into: where the pages start in its
 * chunk_len decompressed bytes).  source indexes the image's
 * CKPT_REC_SOURCES record.
 */
struct ckpt_page_ref {
	uint64_t offset;		/* bytes from vma start */
	uint64_t len;
	uint64_t off;			/* in the source image */
	uint32_t source;
	uint32_t stored;
	uint32_t into;
	uint32_t chunk_len;
};

#define CKPT_SOURCE_NAME_MAX 240
struct ckpt_source {			/* an earlier image, checked before use */
	uint64_t size;
	uint64_t xxh3;			/* its file checksum, as in its manifest */
	char name[CKPT_SOURCE_NAME_MAX];	/* "ckpt-NNNN/<image>", from the job dir */
};

/*
 * Beside each image of an incremental job, <image>.pages: where every
 * saved page of the process lies and its hash, for the next checkpoint
 * to compare with.  A header, the pages by address, the sources (a
 * page's source 0: the image itself, k: its CKPT_REC_SOURCES entry
 * k - 1).  Never needed by a restart; a sidecar that does not check out
 * makes the next image full.
 */
#define CKPT_PAGES_MAGIC 0x3153475054504b43ULL	/* "CKPTPGS1" */
struct ckpt_pages_header {
	uint64_t magic;
	uint64_t image_size, image_xxh3;	/* the image it describes */
	uint32_t nsources;		/* struct ckpt_source, after the header */
	uint32_t chain;			/* images since the last full one */
	uint64_t npages;		/* struct ckpt_page_loc, after the sources */
	uint64_t body_xxh3;		/* of everything after the header */
};

struct ckpt_page_loc {
	uint64_t addr;
	uint64_t hash_lo, hash_hi;	/* XXH3-128 of its bytes */
	uint64_t off;			/* as struct ckpt_page_ref */
	uint32_t source;		/* 0: the image itself */
	uint32_t stored;
	uint32_t into;
	uint32_t chunk_len;
};

struct ckpt_regs {			/* callee-saved state of a parked thread */
	uint64_t rbx, rbp, r12, r13, r14, r15, rsp, rip;
};

#define CKPT_THREAD_LEADER 1
#define CKPT_THREAD_CHECKPOINTER 2

struct ckpt_thread {
	int32_t tid;
	uint32_t flags;
	uint64_t fs_base;
	uint64_t clear_child_tid;	/* PR_GET_TID_ADDRESS */
	uint64_t rseq_addr;
	uint32_t rseq_len;
	uint32_t rseq_sig;
	uint64_t sigmask;		/* blocked while parked */
	uint64_t robust_list;		/* get_robust_list */
	uint64_t robust_len;
	int32_t nice;			/* scheduling, each thread's own */
	int32_t policy;			/* with SCHED_RESET_ON_FORK */
	int32_t sched_priority;
	int32_t pdeath_signal;		/* PR_SET_PDEATHSIG */
	int32_t no_new_privs;		/* PR_SET_NO_NEW_PRIVS: a thread's own */
	int32_t caps_read;		/* 1: the capability sets below are saved */
	uint64_t cpu_affinity[16];	/* CPUs 0-1023; all 0: not read */
	uint64_t cap_effective;		/* capabilities, each thread's own */
	uint64_t cap_permitted;
	uint64_t cap_inheritable;
	uint64_t cap_ambient;
	uint64_t cap_bounding;
	uint32_t securebits;		/* PR_GET_SECUREBITS, if caps_read */
	int32_t ioprio;			/* ioprio_get(2), each thread's own; 0: none set */
	char comm[16];			/* PR_GET_NAME: the thread's name */
	/* group credentials, each thread's own: real, effective, saved and
	 * filesystem group ids, and the supplementary groups (ngroups above
	 * CKPT_MAX_GROUPS: more than were saved) */
	uint32_t gids[4];
	uint32_t ngroups;
	uint32_t groups[CKPT_MAX_GROUPS];
	uint32_t personality;		/* personality(2), each thread's own */
	uint32_t timer_slack_ns;	/* PR_GET_TIMERSLACK, each thread's own */
	uint64_t pending;		/* signals pending for it alone (SigPnd) */
	struct ckpt_regs regs;
};

struct ckpt_ksigaction {		/* the kernel's struct sigaction */
	uint64_t handler;
	uint64_t flags;
	uint64_t restorer;
	uint64_t mask;
};

struct ckpt_itimer {
	int64_t interval_sec, interval_usec;
	int64_t value_sec, value_usec;
};

/*
 * A POSIX timer (timer_create), as /proc/self/timers and timer_gettime
 * show it; restored with its id (PR_TIMER_CREATE_RESTORE_IDS), its
 * notification, and what was left of its time.
 */
#define CKPT_MAX_TIMERS 64

struct ckpt_posix_timer {
	int32_t id;			/* the kernel's timer id */
	int32_t clockid;
	int32_t notify;			/* SIGEV_SIGNAL, SIGEV_NONE, or SIGEV_THREAD_ID */
	int32_t signo;
	int32_t tid;			/* SIGEV_THREAD_ID: the thread it signals */
	int32_t pad;
	uint64_t sigval;
	int64_t interval_ns;
	int64_t value_ns;		/* left until it expires; 0: disarmed */
};

/*
 * System V semaphore sets and message queues of the job's IPC namespace
 * (those of its user), saved once per host by the process that claims
 * them, recreated with their ids in the restart's IPC namespace.
 */
#define CKPT_SYSV_MAX_SEMS 32000	/* SEMMSL's ceiling */
#define CKPT_SYSV_MAX_MSGS 65536

struct ckpt_sysv_sem {			/* followed by nsems uint16_t values */
	int32_t id;
	int32_t key;
	uint32_t mode;			/* permissions */
	uint32_t nsems;
};

struct ckpt_sysv_msg {			/* followed by nmsgs messages */
	int32_t id;
	int32_t key;
	uint32_t mode;
	uint32_t nmsgs;
	uint64_t qbytes;		/* msg_qbytes: the queue's capacity */
};

struct ckpt_sysv_message {		/* followed by len bytes, padded to 8 */
	int64_t type;
	uint64_t len;
};

struct ckpt_mq_message {		/* followed by len bytes, padded to 8 */
	uint32_t prio;
	uint32_t len;
};

/* The signals pending in one queue, with what a handler reads of each
 * (siginfo_t, CKPT_SIGINFO_SIZE bytes), oldest first.  The pending
 * bitmasks (ckpt_process.shared_pending, ckpt_thread.pending) still hold
 * every pending signal; one with no siginfo here comes back without. */
#define CKPT_SIGINFO_SIZE 128

/* A kernel AIO request submitted and not reaped: its context (the ring's
 * address) and its iocb, in the process's memory. */
struct ckpt_aio_request {
	uint64_t ctx;
	uint64_t iocb;
};

struct ckpt_signal_queue {		/* followed by count siginfos */
	int32_t tid;			/* the queue of this thread; 0: the process's */
	uint32_t count;
};

struct ckpt_rlim {
	uint64_t cur, max;
};

#define CKPT_NSIG 65
/* The shim parks threads with glibc's SIGSETXID (33): never pending in a
 * restored process. */
#define CKPT_PARKING_SIGNAL 33
#define CKPT_NRLIMITS 16
#define CKPT_AUXV_WORDS 64
#define CKPT_PATH_MAX 4096

#define CKPT_MAX_ZOMBIES 256

struct ckpt_zombie {
	int32_t pid;
	int32_t status;			/* as waitpid() reports it */
};

struct ckpt_process {
	uint32_t umask;
	int32_t pgid;
	int32_t sid;
	int32_t ppid;
	uint64_t start_code, end_code, start_data, end_data;
	uint64_t start_brk, brk, start_stack;
	uint64_t arg_start, arg_end, env_start, env_end;
	uint64_t auxv[CKPT_AUXV_WORDS];
	uint32_t auxv_words;
	uint32_t future_locks;		/* mlockall(MCL_FUTURE): CKPT_ADVICE_LOCKED,
					 * and LOCKONFAULT for MCL_ONFAULT */
	uint64_t shared_pending;	/* process-wide pending signals (ShdPnd) */
	struct ckpt_ksigaction sigactions[CKPT_NSIG];
	struct ckpt_itimer itimers[3];
	struct ckpt_rlim rlimits[CKPT_NRLIMITS];
	char cwd[CKPT_PATH_MAX];
	char exe[CKPT_PATH_MAX];
	int32_t dumpable;		/* prctl attributes of the process */
	int32_t child_subreaper;
	int32_t thp_disable;
	uint32_t membarrier;		/* CKPT_MEMBARRIER_*: registrations */
	uint32_t nzombies;		/* children that exited, not yet waited for */
	uint32_t ntimers;
	uint32_t ctty_pty;		/* the controlling terminal: the pty's
					 * number + 1; 0: none, or not a pty */
	int32_t ctty_foreground;	/* its foreground process group */
	uint32_t mdwe;			/* PR_GET_MDWE: memory-deny-write-execute */
	uint32_t pad;
	struct ckpt_zombie zombies[CKPT_MAX_ZOMBIES];
	struct ckpt_posix_timer timers[CKPT_MAX_TIMERS];
};

enum ckpt_fd_kind {
	CKPT_FD_FILE = 1,		/* regular file: reopened at offset; a scratch
				 * file's contents saved, to recreate it */
	CKPT_FD_DELETED_FILE = 2,	/* unlinked regular file: contents saved;
					 * a memfd's seals in value[0] */
	CKPT_FD_DEVICE = 3,		/* /dev/null and other char devices: reopened */
	CKPT_FD_TTY = 4,		/* terminal: the restarter's terminal */
	CKPT_FD_PIPE_READ = 5,		/* pipe: contents saved by its readers */
	CKPT_FD_PIPE_WRITE = 6,
	CKPT_FD_INHERIT = 7,		/* stdio to outside the job: restarter's */
	CKPT_FD_EXTERNAL = 8,		/* unsupported: /dev/null at restart */
	CKPT_FD_DIRECTORY = 9,
	CKPT_FD_SOCKET = 10,		/* Unix or TCP/UDP socket: queue saved */
	CKPT_FD_EVENTFD = 11,		/* value[0]: count, value[1]: semaphore */
	CKPT_FD_EPOLL = 12,		/* data: struct ckpt_epoll_entry[] */
	CKPT_FD_TIMERFD = 13,		/* value: clock, flags, interval, next (ns),
					 * expirations not read yet */
	CKPT_FD_SIGNALFD = 14,		/* value[0]: the signal mask */
	CKPT_FD_PTY_MASTER = 15,	/* /dev/ptmx; object_id: the pty's number;
					 * data: struct ckpt_pty, then its bytes */
	CKPT_FD_PTY_SLAVE = 16,		/* /dev/pts/N; object_id: the pty's number */
	CKPT_FD_FIFO = 17,		/* named pipe: reopened, bytes like a pipe's */
	CKPT_FD_PIDFD = 18,		/* value[0]: the pid it refers to, 0: a
					 * process that has exited */
	CKPT_FD_MQUEUE = 19,		/* POSIX message queue; path: its name;
					 * value: mq_maxmsg, mq_msgsize, whether the
					 * data holds its messages (struct
					 * ckpt_mq_message each), unlinked */
	CKPT_FD_INOTIFY = 20		/* data: struct ckpt_inotify_watch, then
					 * its path, per watch */
};

/* An inotify watch: its number, mask, and the path it was added with. */
struct ckpt_inotify_watch {
	int32_t wd;
	uint32_t mask;
	uint32_t path_len;		/* bytes of path after this struct */
	uint32_t pad;
};

/*
 * File locks held through a file's fd (its fdinfo "lock:" lines), at most
 * CKPT_FD_LOCKS: value[0] their count; lock i is value[1 + 2i] = its first
 * byte | its kind << 56, value[2 + 2i] = its last byte (UINT64_MAX: to
 * the end of the file, wherever that is).
 */
#define CKPT_FD_LOCKS 2
#define CKPT_LOCK_POSIX 1		/* fcntl F_SETLK: the process's */
#define CKPT_LOCK_FLOCK 2		/* flock(): the open file's */
#define CKPT_LOCK_OFD 3			/* fcntl F_OFD_SETLK: the open file's */
#define CKPT_LOCK_WRITE 4		/* or'ed in: exclusive, else shared */
#define CKPT_LOCK_LEASE 8		/* fcntl F_SETLEASE: the open file's;
					 * its first byte is the break signal
					 * (F_SETSIG, 0: SIGIO) */
#define CKPT_LOCK_START_MASK 0xffffffffffffff	/* 56 bits */

#define CKPT_SOCK_LISTENING 1
#define CKPT_SOCK_CONNECTED 2
#define CKPT_SOCK_BOUND 4		/* has a local address of its own */
#define CKPT_SOCK_SHUT_WR 8		/* shut down for writing (SEND_SHUTDOWN) */
#define CKPT_SOCK_SHUT_RD 16		/* for reading (the peer's SHUT_WR too) */
#define CKPT_SOCK_PEER_FIN 32		/* TCP: the peer shut down writing (or closed):
					 * EOF after the queue */
#define CKPT_SOCK_FILTER_LOCKED 64	/* SO_LOCK_FILTER */
#define CKPT_SOCK_FILTER_MAX 4096	/* BPF_MAXINSNS */
#define CKPT_SOCK_OPTS 40		/* options saved per socket, at most */

struct ckpt_sockaddr {
	uint32_t len;
	uint8_t addr[128];		/* struct sockaddr_storage */
};

/* One socket option, as getsockopt() gave it and setsockopt() takes it. */
struct ckpt_sockopt {
	int32_t level;
	int32_t name;
	uint32_t len;
	uint32_t pad;
	uint8_t value[16];
};

struct ckpt_epoll_entry {
	int32_t fd;
	uint32_t events;
	uint64_t data;
};

/* A pseudo-terminal, as its master's holder saw it: the slave's settings
 * (struct termios, speeds as B* constants), its window size, and the
 * bytes queued and not read yet, output_len written by the slave for the
 * master, then input_len written to the master for the slave. */
struct ckpt_pty {
	uint32_t iflag, oflag, cflag, lflag;
	uint8_t line;
	uint8_t cc[32];
	uint8_t pad[3];
	uint32_t ispeed, ospeed;
	uint16_t rows, cols, xpixel, ypixel;
	uint32_t output_len, input_len;
};

struct ckpt_fd {
	int32_t fd;
	uint32_t kind;
	int32_t flags;			/* F_GETFL */
	int32_t fd_flags;		/* F_GETFD */
	int64_t offset;
	uint32_t mode;
	uint32_t path_len;		/* bytes of path after this struct */
	uint64_t data_size;		/* bytes of data after the path */
	uint64_t object_id;		/* inode of a pipe or a deleted file: the
					 * same object in every process */
	int32_t stdio_fd;		/* CKPT_FD_INHERIT: which restarter fd */
	int32_t dup_of;			/* lower fd sharing this open file, or -1 */
	/* CKPT_FD_SOCKET; the data are the bytes of its receive queue,
	 * datagrams each after a uint32_t length, then its classic BPF
	 * filter (sock_filter_len struct sock_filter, 8 bytes each) */
	uint64_t peer_id;		/* object_id of the connected peer socket */
	int32_t sock_domain;		/* AF_UNIX, AF_INET(6), AF_NETLINK, AF_PACKET */
	int32_t sock_type;		/* SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET, SOCK_RAW */
	uint32_t sock_flags;		/* CKPT_SOCK_* */
	int32_t sock_backlog;
	struct ckpt_sockaddr sock_local;
	struct ckpt_sockaddr sock_peer;
	uint64_t value[6];		/* eventfd, timerfd, signalfd state;
					 * CKPT_FD_PIPE_READ: value[0] 1 when
					 * no writer was left (EOF after the data),
					 * value[1] 1 when the data are packets
					 * (O_DIRECT), each after a uint32_t length;
					 * CKPT_FD_PIPE_WRITE, a CKPT_FD_FIFO open
					 * O_WRONLY: value[0] 1 when no reader was
					 * left (writes fail, EPIPE);
					 * CKPT_FD_FILE, CKPT_FD_DELETED_FILE: the
					 * locks held through it (below) */
	int32_t share_pid;		/* CKPT_FD_FILE, CKPT_FD_PIPE_*, /dev/tty: the same
					 * open file (offset, flags) as fd
					 * share_fd of process */
	int32_t share_fd;		/* share_pid, inherited across fork; 0: none */
	/* CKPT_FD_SOCKET: the options the application changed, for setsockopt() */
	uint32_t nsock_opts;
	int32_t sock_protocol;		/* socket()'s third argument (ICMP, raw,
					 * netlink, packet sockets need theirs);
					 * the path of a packet socket bound to
					 * an interface is the interface's name */
	struct ckpt_sockopt sock_opts[CKPT_SOCK_OPTS];
	/* O_ASYNC: who gets the signal-driven I/O signal (F_SETOWN_EX), and
	 * which signal (F_SETSIG, 0: SIGIO) */
	int32_t owner_type;		/* F_OWNER_TID, F_OWNER_PID, F_OWNER_PGRP */
	int32_t owner_pid;		/* 0: nobody */
	int32_t async_signal;
	uint32_t sock_filter_len;	/* SO_ATTACH_FILTER instructions; 0: none */
	uint32_t contents_saved;	/* CKPT_FD_FILE: the data are the file's
					 * contents (a scratch file; maybe none) */
};

struct ckpt_plugin_blob {
	char name[32];
	uint64_t size;			/* bytes of plugin data after this struct */
};

/* An IPv4 address of a host that the restart moved to another host. */
struct ckpt_addr_move {
	uint32_t from, to;		/* network byte order */
};

#define CKPT_ADDR_MOVES_MAX 64

/* Lives in the shim; ckpt-restart fills it after restoring memory. */
struct ckpt_restart_info {
	uint32_t generation;		/* incremented on every restart */
	uint32_t naddr_moves;		/* hosts moved by this restart */
	char coord_path[108];
	char job_id[64];
	struct ckpt_addr_move addr_moves[CKPT_ADDR_MOVES_MAX];
};
/* cffi:end */

#define CKPT_RESERVE_END ((uint64_t)CKPT_RESERVE_START + CKPT_RESERVE_SIZE)

#endif
