/* Internal interfaces of libckpt.so, the LD_PRELOAD checkpoint shim. */
#ifndef CKPT_SHIM_H
#define CKPT_SHIM_H

#include <stdint.h>
#include <stddef.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>
#include "ckpt_image.h"
#include "ckpt_plugin.h"
#include "ckpt_kv.h"
#include "ckpt_proc.h"

/* Parking signal: glibc's SIGSETXID.  glibc keeps its two internal signals
 * (32, 33) out of the application's hands (sigaction refuses them,
 * sigfillset, sigprocmask and pthread_sigmask leave them out), so every
 * signal the application may use stays its own. */
#define CKPT_SIGNAL CKPT_PARKING_SIGNAL
#define CKPT_MAX_THREADS 4096
#define CKPT_ENGINE_VERSION "0.1.0"

#define SHIM_HIDDEN __attribute__((visibility("hidden")))
/* The library is built with hidden visibility: what it interposes on the
 * application (signal and exec functions) must be exported explicitly. */
#define SHIM_EXPORT __attribute__((visibility("default")))

/*
 * Memory system calls, made directly: libraries of the application patch
 * mmap, munmap, mprotect, shmat and shmdt in every loaded object (UCX's
 * memory hooks), and their hooks, which allocate and take locks, must
 * never run on the checkpoint thread while the application is parked.
 */
static inline void *shim_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	long r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);

	return r == -1 ? MAP_FAILED : (void *)r;
}

static inline int shim_munmap(void *addr, size_t len)
{
	return syscall(SYS_munmap, addr, len);
}

static inline int shim_mprotect(void *addr, size_t len, int prot)
{
	return syscall(SYS_mprotect, addr, len, prot);
}

static inline void *shim_shmat(int id, const void *addr, int flags)
{
	long r = syscall(SYS_shmat, id, addr, flags);

	return r == -1 ? (void *)-1 : (void *)r;
}

static inline int shim_shmdt(const void *addr)
{
	return syscall(SYS_shmdt, addr);
}

/* context.S */
SHIM_HIDDEN int ckpt_save_context(struct ckpt_regs *regs) __attribute__((returns_twice));
SHIM_HIDDEN void ckpt_resume_context(const struct ckpt_regs *regs, long ret)
	__attribute__((noreturn));

/* One object (shared memory, pipe) on this host, whatever maps or holds it. */
static inline uint64_t shim_object_id(uint64_t dev, uint64_t ino)
{
	return ino ^ (dev << 48);
}

/* engine/log.c: messages on stderr, never through stdio (locks may be held) */
SHIM_HIDDEN void shim_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
SHIM_HIDDEN int64_t shim_now_ns(void);
SHIM_HIDDEN const char *shim_hostname(void);
void shim_hostname_forget(void);
SHIM_HIDDEN const char *shim_strerror(int err);

/* engine/procfs.c */
SHIM_HIDDEN uint64_t shim_status_mask(const char *path, const char *field);

/* engine/signals.c: the parking signal, shared with glibc's set*id broadcast */
SHIM_HIDDEN int signals_init(void (*handler)(int, siginfo_t *, void *));
SHIM_HIDDEN int signals_reclaim(void);
SHIM_HIDDEN int signals_chain(int sig, siginfo_t *si, void *uc);

/* wrappers/syscall_restart.c: a parked thread's interrupted system call goes on as
 * if no signal had come.  parked_ns: CLOCK_MONOTONIC when it parked. */
SHIM_HIDDEN void syscall_sites_init(void);
SHIM_HIDDEN void syscall_restart_resume(void *uc, int64_t parked_ns, int restored);

/* state/stopped_children.c: a parent's stopped children, their stop and its
 * SIGCHLD told again as the parent had seen them */
SHIM_HIDDEN void stopped_children_note(void);
SHIM_HIDDEN void stopped_children_restore(void);

/* state/aio.c: kernel AIO requests submitted and not reaped */
SHIM_HIDDEN void aio_note_call(long nr, const long *args, long result);
SHIM_HIDDEN int aio_requests_unsupported(char *why, size_t why_size);

/* state/task_files.c: fds on files of threads that have exited */
SHIM_HIDDEN int task_files_unsupported(char *why, size_t why_size);

/* state/rseq_areas.c: a thread's rseq area registered by the program itself */
SHIM_HIDDEN void rseq_note_call(long nr, const long *args, long result);
SHIM_HIDDEN int rseq_own_area(struct ckpt_thread *rec);

/* wrappers/seccomp_calls.c: threads in seccomp mode cannot be parked (yet) */
SHIM_HIDDEN void seccomp_init(void);
SHIM_HIDDEN void seccomp_note_call(long nr);
SHIM_HIDDEN int seccomp_check_threads(char *why, size_t size);

/* wrappers/timed_calls.c: blocking calls with a relative timeout, timed by the shim
 * so that a call a checkpoint interrupted goes on with the time it had left */
struct timed_call {
	long nr;			/* the system call the wrapper makes */
	int64_t deadline_ns;		/* CLOCK_MONOTONIC */
	int ckpt_interrupted;		/* its EINTR came from parking */
	struct timed_call *outer;	/* a wrapped call in a signal handler */
};
SHIM_HIDDEN extern __thread struct timed_call *timed_call_current
	__attribute__((tls_model("initial-exec")));
SHIM_HIDDEN void timed_call_begin(struct timed_call *tc, long nr, int64_t timeout_ns);
SHIM_HIDDEN int timed_call_again(struct timed_call *tc, int ret);
SHIM_HIDDEN void timed_call_end(struct timed_call *tc);
SHIM_HIDDEN int64_t timed_call_left_ns(const struct timed_call *tc);
/* the shim's syscall(): RIP after its `syscall` instruction, number in R12 */
SHIM_HIDDEN extern const char shim_raw_syscall_return[];
SHIM_HIDDEN void syscall_just_returned(const void *uc, long call[8]);

/* engine/quiesce.c: park every thread but the checkpointer */
struct parked_thread {
	struct ckpt_thread rec;
	_Atomic int state;		/* enum park_state */
	unsigned gen;			/* resume generation it waits on */
	/* a call of the shim's syscall() it was parked right after, before
	 * its wrapper ran: number (0: none), six arguments, result */
	long returned_call[8];
};
SHIM_HIDDEN int quiesce_suspend(int timeout_ms);
SHIM_HIDDEN void quiesce_resume(void);
SHIM_HIDDEN int quiesce_wait_restored(int timeout_ms);
SHIM_HIDDEN int quiesce_leader_gone(void);
SHIM_HIDDEN unsigned quiesce_count(void);
SHIM_HIDDEN const struct parked_thread *quiesce_thread(unsigned i);
SHIM_HIDDEN void quiesce_handler(int sig, siginfo_t *si, void *uc);
/* fn(arg) in a parked thread of the application (its fd table) */
SHIM_HIDDEN int quiesce_run_in_app(void (*fn)(void *), void *arg);
SHIM_HIDDEN void thread_fill_record(struct ckpt_thread *rec);

/* state/queued_signals.c: the siginfo of pending signals */
SHIM_HIDDEN uint64_t queued_signals_own_pending(void);
SHIM_HIDDEN void queued_signals_take_thread(unsigned slot, uint64_t pending);
SHIM_HIDDEN void queued_signals_take_process(const struct ckpt_process *p);
SHIM_HIDDEN void queued_signals_release(void);
SHIM_HIDDEN void queued_signals_forget(void);
SHIM_HIDDEN int drop_restart_capabilities(const struct ckpt_thread *rec);

/* engine/coord.c: the line protocol to the coordinator */
SHIM_HIDDEN int coord_connect(const char *path);
SHIM_HIDDEN void coord_close(void);
SHIM_HIDDEN void coord_forget(void);	/* after a restart: the fd is gone */
SHIM_HIDDEN int coord_fd(void);
SHIM_HIDDEN int coord_send(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
SHIM_HIDDEN int coord_recv(char *line, size_t size);	/* 0, or -1 on EOF/error */
/* the name service over this connection (PHASE lines that come before an
 * answer wait for coord_recv) */
SHIM_HIDDEN const struct kv_client *coord_kv(void);

/* engine/plugin.c */
SHIM_HIDDEN int plugins_run(const struct ckpt_hook_ctx *ctx, char *why, size_t why_size);
SHIM_HIDDEN void plugins_clear_failure(void);
SHIM_HIDDEN int kv_claim(const char *key, const char *value, char *owner, size_t size);
SHIM_HIDDEN int kv_claim_mine(const char *key);
SHIM_HIDDEN int kv_wait(const char *key, int seconds);

/* state/fds.c: the built-in fd plugin and the fd records */
SHIM_HIDDEN void fds_plugin_init(void);
struct stat;
SHIM_HIDDEN int app_stat(int fd, struct stat *st);	/* the application's fd, from any thread */

/* Bytes an fd record carries after its path (socket queue, epoll set),
 * in a scratch buffer. */
struct fd_payload {
	char *data;
	size_t len, cap;
};

/* state/ptys.c: a pty's end; the master's record carries the pty's state */
SHIM_HIDDEN int pty_describe(int fd, const struct stat *st, struct ckpt_fd *rec,
			     struct fd_payload *q, unsigned seq);
SHIM_HIDDEN void pty_controlling_terminal(struct ckpt_process *p);
SHIM_HIDDEN int tty_settings_describe(int fd, struct fd_payload *q);

/* state/mqueues.c: a POSIX message queue's fd; its messages once per host */
SHIM_HIDDEN void mqueues_collect_begin(void);
SHIM_HIDDEN void mqueues_restarted(void);
SHIM_HIDDEN int is_mqueue(int fd);
SHIM_HIDDEN int mqueue_describe(int fd, unsigned seq, struct ckpt_fd *rec, struct fd_payload *q);
SHIM_HIDDEN const char *mqueue_created(unsigned i);
SHIM_HIDDEN int mqueue_describe_name(const char *name, unsigned seq, struct ckpt_fd *rec,
				     struct fd_payload *q);

/* state/sockets.c */
SHIM_HIDDEN int app_getfd(int fd);
/* the application's fd numbers, ascending (fds.c); or -errno */
SHIM_HIDDEN int app_list_fds(int *fds, int max);
SHIM_HIDDEN int socket_describe(int fd, uint64_t ino, struct ckpt_fd *rec, struct fd_payload *q,
				char *path, size_t path_size);
SHIM_HIDDEN int sockets_settle(const int *fds, int nfds, char *why, size_t why_size);
SHIM_HIDDEN void sockets_reset_on_close(const int *fds, int nfds);
SHIM_HIDDEN uint64_t socket_unix_peer(uint64_t ino);	/* 0: none */
/* state/backlog.c: connections a listener has not accepted yet */
SHIM_HIDDEN int backlog_note_holders(unsigned seq, const int *socks, int n);
SHIM_HIDDEN int backlog_take(unsigned seq, const int *socks, int n);
SHIM_HIDDEN int backlog_accept(int listener, int flags, int *fd);
SHIM_HIDDEN int backlog_was_token(int listener, int accepted);
SHIM_HIDDEN void backlog_accept_begin(void);
SHIM_HIDDEN void backlog_accept_end(void);
SHIM_HIDDEN void backlog_restarted(void);

/* state/sockopts.c: the socket buffer sizes the application set */
#define SOCKOPT_SET_SNDBUF 1
#define SOCKOPT_SET_RCVBUF 2
SHIM_HIDDEN unsigned sockopt_buffers_set(uint64_t ino);
SHIM_HIDDEN void sockopt_buffers_renew(void);

/* state/socket_peers.c: connections inside the job, and the ones leading out */
SHIM_HIDDEN int fd_left_outside(int fd);	/* ckpt_fd_left_outside */
SHIM_HIDDEN int socket_peers_publish(const int *socks, int n);
enum { PEER_NONE, PEER_IN_JOB, PEER_PENDING, PEER_OUTSIDE };
SHIM_HIDDEN int socket_peer(int fd, int report);
SHIM_HIDDEN int socket_end_ready(int fd);	/* its end is to be flushed */
SHIM_HIDDEN int socket_peer_ready(int fd);	/* and its peer's is too */

/* state/tcp_flush.c: TCP connections inside the job, emptied with a marker */
SHIM_HIDDEN int tcp_flush_choose(const int *socks, const int *peers, int n, int *others);
SHIM_HIDDEN int tcp_flush(const char *marker_hex, char *why, size_t why_size);
SHIM_HIDDEN int tcp_flushed_queue(uint64_t ino, const char **data, size_t *len);
SHIM_HIDDEN void tcp_flush_give_back(int restarted);

/* state/event_fds.c: eventfd, epoll, timerfd and signalfd, from fdinfo */
SHIM_HIDDEN int event_fd_describe(int fd, const char *link, struct ckpt_fd *rec,
				  struct fd_payload *q);
/* state/inotify_queue.c: events queued at a checkpoint, handed to read() */
SHIM_HIDDEN int inotify_take_queued(char *why, size_t why_size);
SHIM_HIDDEN int image_writer_process(void);	/* engine/writer.c */
SHIM_HIDDEN void inotify_taken_restarted(void);
/* state/inotify_watches.c: the watches, with the paths the program gave */
SHIM_HIDDEN int inotify_describe(int fd, const char *info, struct ckpt_fd *rec,
				 struct fd_payload *q);

/* engine/image_writer.c: buffered, hashed writing of the image file */
struct image_writer;
SHIM_HIDDEN struct image_writer *iw_open(int dirfd, const char *name);
SHIM_HIDDEN int iw_append(struct image_writer *w, const void *p, size_t len);
SHIM_HIDDEN int iw_record(struct image_writer *w, uint32_t type, const void *p, size_t len);
SHIM_HIDDEN int iw_direct(struct image_writer *w, const void *p, size_t len);
SHIM_HIDDEN int iw_pad_to_page(struct image_writer *w);
SHIM_HIDDEN uint64_t iw_offset(const struct image_writer *w);
SHIM_HIDDEN int iw_finish(struct image_writer *w, uint64_t *size, uint64_t *xxh3);
SHIM_HIDDEN void iw_abort(struct image_writer *w, int dirfd, const char *name);
SHIM_HIDDEN void iw_sums_name(char *out, size_t size, const char *image);
SHIM_HIDDEN int queued_signals_write(struct image_writer *w);
SHIM_HIDDEN int aio_requests_write(struct image_writer *w);
SHIM_HIDDEN uint64_t shim_xxh3(const void *p, size_t len);

/* save_*.c: the records of one image */
SHIM_HIDDEN int collect_process(struct ckpt_process *p, char *detail, size_t size);

/* state/sysv_ipc.c: System V semaphore sets and message queues, once per host */
struct sysv_snapshot;
SHIM_HIDDEN int sysv_ipc_snapshot(unsigned seq, struct sysv_snapshot **out, char *detail,
				  size_t size);
SHIM_HIDDEN int sysv_ipc_write(struct image_writer *w, const struct sysv_snapshot *s);
SHIM_HIDDEN void sysv_ipc_free(struct sysv_snapshot *s);
SHIM_HIDDEN void process_job_children(char *out, size_t size);
SHIM_HIDDEN int restore_exe_link(void);
SHIM_HIDDEN int save_threads(struct image_writer *w, const struct ckpt_thread *self);
/* shared_key: "shm:<checkpoint>:<host>", under which processes claim the
 * shared memory they save; NULL: every process saves what it maps */
struct fd_table;
struct shm_snapshot;
struct vma_advice_table;
SHIM_HIDDEN int memory_unsupported(char *why, size_t why_size);
SHIM_HIDDEN int shim_page_is_zero(const void *p);
struct increments;
SHIM_HIDDEN int save_memory(struct image_writer *w, const char *shared_key,
			    const struct fd_table *fds, const struct shm_snapshot *shm,
			    const struct vma_advice_table *advice, int compression,
			    struct increments *inc);

/* engine/incremental.c: pages unchanged since the previous image are referred to */
SHIM_HIDDEN struct increments *increments_begin(int dirfd, const char *image,
						const char *parent_dir, int *err);
SHIM_HIDDEN void increments_split(struct increments *inc, uint64_t start,
				  struct ckpt_run *runs, long *nruns,
				  struct ckpt_page_ref *refs, uint64_t *nrefs, int drop_zero);
SHIM_HIDDEN int increments_place(struct increments *inc, uint64_t data_offset,
				 uint64_t data_size, const struct ckpt_chunk *chunks,
				 uint64_t nchunks);
SHIM_HIDDEN int increments_write_sources(struct increments *inc, struct image_writer *w);
SHIM_HIDDEN int increments_finish(struct increments *inc, int dirfd, const char *image,
				  uint64_t size, uint64_t xxh3, char *keys, size_t keys_size);
SHIM_HIDDEN void increments_abort(struct increments *inc, int dirfd);

/* engine/cpu_tasks.c: the image writer's helpers, one per CPU */
struct cpu_tasks;
SHIM_HIDDEN struct cpu_tasks *cpu_tasks_new(int *err);
SHIM_HIDDEN void cpu_tasks_free(struct cpu_tasks *t);
SHIM_HIDDEN unsigned cpu_tasks_count(const struct cpu_tasks *t);
SHIM_HIDDEN void cpu_tasks_run(struct cpu_tasks *t, unsigned want, int (*fn)(void *),
			       void *arg);
SHIM_HIDDEN void cpu_tasks_run_beside(struct cpu_tasks *t, unsigned want, int (*fn)(void *),
				      void *arg, int (*own)(void *), void *own_arg);

/* engine/compress.c: page data in chunks, compressed on every CPU (--compress) */
#define CKPT_COMPRESSION_NONE 0
#define CKPT_COMPRESSION_ZSTD 1		/* every record */
#define CKPT_COMPRESSION_AUTO 2		/* records whose samples shrink */
struct compressor;
/* len bytes of the record's page data, from off on: where they lie when
 * contiguous, else copied to buf; NULL when they cannot be read */
typedef const void *(*compress_gather_fn)(void *ctx, uint64_t off, size_t len, void *buf);
SHIM_HIDDEN int seccomp_here(void);
SHIM_HIDDEN struct compressor *compressor_new(int mode, uint64_t max_bytes, int *err);
SHIM_HIDDEN void compressor_free(struct compressor *c);
SHIM_HIDDEN int compress_record(struct compressor *c, struct image_writer *w,
				uint64_t data_size, compress_gather_fn gather, void *ctx,
				const struct ckpt_chunk **chunks, uint64_t *nchunks,
				uint64_t *stored);
SHIM_HIDDEN void compress_write_later(struct compressor *c);
SHIM_HIDDEN int compress_flush(struct compressor *c, struct image_writer *w);
/* mlock and madvise state of every region, from smaps (vma_advice.c) */
SHIM_HIDDEN struct vma_advice_table *vma_advice_read(int *err);
SHIM_HIDDEN uint32_t vma_advice_at(const struct vma_advice_table *t, uint64_t addr);
SHIM_HIDDEN uint32_t vma_advice_future(const struct vma_advice_table *t);
SHIM_HIDDEN int vma_advice_unforkable(const struct vma_advice_table *t);
SHIM_HIDDEN void vma_advice_free(struct vma_advice_table *t);
/* a forked writer's copies of the shared memory it saves (shm_snapshot.c) */
SHIM_HIDDEN struct shm_snapshot *snapshot_shared_memory(const char *shared_key, int *err);

/* engine/shm_snapshot.c */
struct shm_window {
	uint64_t start, end;
	char *copy;		/* its pages as the job stopped, or NULL */
	int elsewhere;		/* another process saves it */
};
SHIM_HIDDEN struct shm_snapshot *shm_snapshot_new(size_t max_window);
SHIM_HIDDEN int shm_snapshot_add(struct shm_snapshot *set, uint64_t start, uint64_t end,
				 int elsewhere, int readable);
SHIM_HIDDEN const struct shm_window *shm_snapshot_find(const struct shm_snapshot *set,
						       uint64_t start, uint64_t end);
SHIM_HIDDEN uint64_t shm_snapshot_bytes(const struct shm_snapshot *set);
SHIM_HIDDEN void shm_snapshot_free(struct shm_snapshot *set);
struct fd_table;
SHIM_HIDDEN struct fd_table *fds_collect(unsigned seq);	/* while the process is stopped */
SHIM_HIDDEN void fds_reseek_proc_files(void);	/* after a restart */
SHIM_HIDDEN int save_fds(struct image_writer *w, struct fd_table *t);
SHIM_HIDDEN int fds_hold(const struct fd_table *t, uint64_t dev, uint64_t ino);
SHIM_HIDDEN int fds_hold_deleted(const struct fd_table *t, uint64_t dev, uint64_t ino);
SHIM_HIDDEN void fds_release(struct fd_table *t);
SHIM_HIDDEN int shim_is_scratch_path(const char *path);	/* under /tmp, /var/tmp, /dev/shm */

/* memory ranges of the shim's own scratch buffers: not saved */
SHIM_HIDDEN void *scratch_map(size_t len);
SHIM_HIDDEN void scratch_unmap(void *p, size_t len);
SHIM_HIDDEN int scratch_at(uint64_t addr, uint64_t *until);
SHIM_HIDDEN void scratch_forget(void);

/* engine/plugin.c: where warnings go (the coordinator, or a forked writer's pipe);
 * an interrupted wait for fds waits for the plugins still rebuilding */
SHIM_HIDDEN void warnings_to_fd(int fd);
SHIM_HIDDEN void plugins_wait_rebuilt(void);

/* engine/writer.c: the image file, written in place or by a forked child */
/* how WRITE asks for the image (its words: docs/PROTOCOL.md) */
struct write_mode {
	int compression;		/* CKPT_COMPRESSION_* */
	int incremental;		/* hash the pages, write a sidecar */
	const char *parent_dir;		/* and refer to this checkpoint's, or NULL */
	const char *stage_dir;		/* write here (node-local), then copy: or NULL */
};
SHIM_HIDDEN int image_write_now(const char *dir, unsigned seq, const struct ckpt_thread *self,
				const struct write_mode *mode, char *detail, size_t size);
SHIM_HIDDEN int image_write_forked(const char *dir, unsigned seq, const struct ckpt_thread *self,
				   const struct write_mode *mode, char *detail, size_t size);
SHIM_HIDDEN int image_write_wait(char *detail, size_t size);
SHIM_HIDDEN void image_write_cancel(void);
SHIM_HIDDEN void image_writer_forget(void);

/* engine/state_kinds.c: the kinds of state asked at SUSPEND and after a
 * restart, in one table */
SHIM_HIDDEN int state_kinds_before_parking(char *why, size_t size);
SHIM_HIDDEN int state_kinds_parked(char *why, size_t size);
SHIM_HIDDEN void state_kinds_suspended(void);
SHIM_HIDDEN void state_kinds_restarted(void);

/* engine/checkpointer.c */
SHIM_HIDDEN extern struct ckpt_restart_info shim_restart_info;
SHIM_HIDDEN int checkpointer_start(const char *coord_path);
SHIM_HIDDEN int checkpointer_follow_forks(void);
SHIM_HIDDEN const char *checkpointer_coord_path(void);
SHIM_HIDDEN int checkpointer_is_current(void);
SHIM_HIDDEN void checkpointer_atfork_child(void);

/* wrappers/exec.c: exec'd programs load the shim and find the coordinator */
SHIM_HIDDEN void exec_follow_init(void);
SHIM_HIDDEN const char *exec_shim_name(void);
SHIM_HIDDEN const char *exec_flusher_path(void);
SHIM_HIDDEN int checkpointer_memory(uint64_t start, uint64_t end);

/* wrappers/net_addresses.c: the addresses of the first run stay the application's */
struct sockaddr;
void net_addresses_restarted(const struct ckpt_addr_move *moved, unsigned n);
int net_real_getsockname(int s, struct sockaddr *sa, socklen_t *len);
int net_real_getpeername(int s, struct sockaddr *sa, socklen_t *len);

#endif
