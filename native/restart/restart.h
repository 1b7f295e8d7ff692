/* Internal interfaces of ckpt-restart. */
#ifndef CKPT_RESTART_H
#define CKPT_RESTART_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "ckpt_image.h"
#include "ckpt_proc.h"

/* Layout of the reserved range: the binary and its brk heap (randomized
 * within 1 GiB of the binary's end) sit in its first 1.06 GiB; everything
 * ckpt-restart allocates lives above, so it survives the unmapping of the
 * old address space. */
#define ZONE_ARENA (CKPT_RESERVE_START + 0x44000000UL)
#define ZONE_ARENA_SIZE 0x10000000UL
#define ZONE_STACKS (CKPT_RESERVE_START + 0x54000000UL)
#define ZONE_STACK_SIZE 0x10000UL
#define ZONE_MAX_STACKS 4096

#define MAX_VMAS 262144
#define MAX_FDS 4096
#define MAX_THREADS 4096

#define EXIT_RESTART_FAILED 2		/* before the point of no return */
#define EXIT_RESTORE_FAILED 70		/* after it: the process is lost */

struct loaded_vma {
	struct ckpt_vma v;
	const char *path;
	const struct ckpt_run *runs;
	const struct ckpt_run *guards;	/* pages that fault on any access */
	const struct ckpt_chunk *chunks;	/* compressed: v.data_size in chunks */
	const struct ckpt_page_ref *refs;	/* pages of earlier images */
	uint64_t nchunks;
	uint64_t record_start, record_end;	/* the record in the image file */
	int filled;			/* its pages were read in at restore */
	char *aio_ring;			/* CKPT_VMA_AIO_RING: its saved pages, read
					 * before the point of no return */
};

struct loaded_fd {
	struct ckpt_fd f;
	const char *path;
	const char *data;
	const void *sock_filter;	/* f.sock_filter_len instructions; the
					 * loader takes them off f.data_size */
};

struct sysv_object {			/* a CKPT_REC_SYSV_* record's payload */
	uint32_t type;
	uint64_t size;
	const char *data;
};

struct loaded_source {			/* an earlier image (incremental) */
	struct ckpt_source s;
	int fd;
};

#define MAX_SOURCES 64

struct image {
	int fd;
	int peer;			/* another host's: never restored here */
	const char *file;
	struct ckpt_image_header hdr;
	struct ckpt_process *proc;
	struct ckpt_thread *threads;
	unsigned nthreads;
	struct loaded_vma *vmas;
	unsigned nvmas;
	struct loaded_vma *file_pages;	/* CKPT_REC_FILE_PAGES: unlinked files'
					 * pages under private maps (state/shm.c) */
	unsigned nfile_pages;
	struct loaded_fd *fds;
	unsigned nfds;
	struct loaded_fd *exe;		/* CKPT_REC_EXE: a deleted executable, or NULL */
	uint64_t exe_data_off;		/* where its bytes are in the image */
	/* <image>.sum, checked against the manifest: each block's checksum;
	 * a deferred block (the records of private memory the reader fills
	 * after the point of no return) is checked as it is read, the others
	 * before */
	const uint64_t *block_sums;
	uint8_t *deferred;
	uint64_t nblocks;		/* of CKPT_CHECKSUM_BLOCK bytes, the last shorter */
	uint64_t size;			/* of the image file */
	struct loaded_fd *named_mqueues;	/* CKPT_REC_MQUEUE: no fd holds them */
	unsigned nnamed_mqueues;
	struct sysv_object *sysv;
	unsigned nsysv;
	const struct ckpt_signal_queue **signal_queues;	/* CKPT_REC_SIGNALS */
	unsigned nsignal_queues;
	struct loaded_source *sources;	/* CKPT_REC_SOURCES */
	unsigned nsources;
	const struct ckpt_aio_request *aio_requests;	/* CKPT_REC_AIO_REQUESTS */
	unsigned naio_requests;
	unsigned max_threads, max_vmas, max_fds, max_named_mqueues, max_sysv,
		 max_signal_queues, max_file_pages;	/* room */
};

#define MAX_IMAGES 1024

struct restart_args {
	const char *coord;
	const char *job_id;
	const char *xxh3[MAX_IMAGES];
	unsigned nxxh3;
	const char *image[MAX_IMAGES];
	unsigned nimages;
	const char *peer_image[MAX_IMAGES];	/* other hosts' images (cross_host.c) */
	unsigned npeer_images;
	int status_fd;			/* -1, or where "exited N" goes */
	const char *staged_dir;		/* node-local copies of the images (--stage-dir) */
	int lazy;			/* --lazy: lazy.c */
};

/* arena.c */
int arena_init(void);
void *arena_alloc(size_t size);
void *zone_stack(unsigned index);	/* top of a fresh stack, or NULL */

/* log.c */
void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
void set_error_fd(int fd);
int get_error_fd(void);
void fatal(const char *what, long err) __attribute__((noreturn));
void set_failure_hook(void (*hook)(int status));
void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* state/sockopts.c: the socket options an image names */
void sockopts_apply(int s, const struct ckpt_fd *f);
void sockopts_finish(int s, const struct ckpt_fd *f);

/* state/fds.c */
int make_parent_dirs(const char *path);	/* how many it made */
struct loaded_fd;
int open_file_again(const struct loaded_fd *lf);
void recreate_gone_scratch_files(const struct image *imgs, unsigned n);
void make_fifo_again(const struct loaded_fd *lf);

/* helpers.c */
void helpers_init(void);
void helpers_pick_pids(void);
void helpers_run(int (*fn)(void *), void *arg);
#define HELPERS_MAX_TASKS 8		/* fn runs on at most this many at once */

/* state/memory.c */
int region_read_by_pieces(const struct loaded_vma *lv);
#define MEMFD_NAME_MAX 240		/* memfd_create() takes 249 bytes at most */
void memfd_name_of(const char *path, char name[MEMFD_NAME_MAX]);
int unlinked_file_again(const char *name);

/* pages.c */
void reader_prepare(struct image *img);
void reader_add(const struct image *img, uint64_t addr, uint64_t len, uint64_t off);
void reader_add_refs(const struct image *img, const struct loaded_vma *lv);
void reader_add_chunks(const struct image *img, const struct loaded_vma *lv);
void read_region_at(struct image *img, const struct loaded_vma *lv, char *base);
void check_chunks(struct image *img, const struct loaded_vma *lv);
void reader_run(void);

/* image.c */
void image_load(struct image *img, const char *path, const char *xxh3, const char *staged_dir);
void image_load_peer(struct image *img, const char *path);
void read_exact_at(struct image *img, void *buf, size_t len, uint64_t off);

/* namespaces.c */
void enter_namespaces(void);
int namespace_denies_setgroups(void);
int run_init(int (*init_main)(void));

/* tree.c */
void tree_init(struct image *imgs, unsigned n, int (*restorer)(void *), int status_fd);
int tree_run(void);
void tree_enter(struct image *img);
int tree_has_process(pid_t pid);
const struct image *tree_image(pid_t pid);
pid_t proc_path_pid(const char *path);
void tree_report_restored(struct image *img);
int tree_report_fd(void);
int tree_pid_taken(pid_t pid);

/* state/shared.c: what the processes of one restart share */
void shared_create(struct image *imgs, unsigned n, const char *coord);
unsigned shared_fds(int *out, unsigned max);
void shared_close_pipes(void);
void shared_close_shms(void);

/* state/pipes.c */
void pipes_create(struct image *imgs, unsigned n);
void fifos_create(struct image *imgs, unsigned n);
int shared_pipe_end(uint64_t id, int write_end);
int pipe_open_of(int32_t pid, const struct ckpt_fd *f);
unsigned pipe_fds(int *out, unsigned max);
void pipes_close(void);

/* state/shm.c */
void shms_create(struct image *imgs, unsigned n);
int shared_shm_fd(uint64_t id);
int shared_sysv_id(uint64_t id);
char *shared_anon_at(uint64_t id);
int shared_file_rewritten(const char *path);
int shared_anon_waits_in(uint64_t start, uint64_t end);
unsigned shm_fds(int *out, unsigned max);
void shms_close(void);

/* state/sockets.c */
void sockets_create(struct image *imgs, unsigned n, const char *coord);
int restart_socket(const struct ckpt_fd *f);
int same_addr(const struct ckpt_sockaddr *a, const struct ckpt_sockaddr *b);
const char *sockaddr_text(const struct ckpt_sockaddr *a, char *buf, size_t size);
int shared_socket_fd(uint64_t id);
unsigned socket_fds(int *out, unsigned max);
void sockets_close(void);

/* state/files.c */
const struct loaded_fd *job_fd_record(struct image *imgs, unsigned n, int32_t pid, int32_t fd);
void files_create(struct image *imgs, unsigned n);
int shared_file_fd(int32_t pid, const struct ckpt_fd *f);
unsigned open_file_fds(int *out, unsigned max);
void files_close(void);
void dev_ttys_open(const struct image *img);
int dev_tty_fd(int32_t pid, const struct ckpt_fd *f);
unsigned dev_tty_fds(int *out, unsigned max);
void dev_ttys_close(void);
int is_job_dev_tty(const struct image *img, const struct loaded_fd *lf);

/* state/cross_host.c: TCP connections of the job between hosts */
#define MAX_CROSS_ENDS 1024
struct cross_end {
	const struct ckpt_fd *mine;	/* this host's end */
	const struct loaded_fd *far;	/* the other host's, with its queue */
	int fd;				/* the new connection */
	unsigned index;			/* state/sockets.c's socket */
};
void addr_map_add(const char *spec);
void addr_map_apply(struct image *imgs, unsigned n);
unsigned addr_map_get(struct ckpt_addr_move *out, unsigned max);
void cross_host_load(const char *const *paths, unsigned n);
const struct loaded_fd *cross_host_peer(const struct ckpt_fd *f);
void cross_host_connect(struct cross_end *ends, unsigned n, const char *coord);

/* kv.c: the coordinator's name service */
void kv_open(const char *coord);
void kv_close(void);
void kv_put(const char *key, const char *value);
void kv_wait(const char *key, unsigned seconds, char *value, size_t size);

/* state/fds.c */
void prepare_fds(struct image *imgs, unsigned n);
void restore_fds(struct image *img);
void restore_task_fds(struct image *img);
void restore_locks(struct image *img, int posix);	/* posix: after the memory */
int restart_fd_base(void);
int move_high(int fd, const char *what);
void write_all(int fd, const char *p, size_t len, const char *what);
void close_restart_fds(void);

/* state/memory.c */
void prepare_memory(struct image *img);
void restore_memory(struct image *img);
void memory_add_pages(const struct image *img, const struct loaded_vma *lv);

/* lazy.c: --lazy, private memory filled on demand by a page server */
void lazy_init(struct image *imgs, unsigned n);
int lazy_region(const struct loaded_vma *lv);
unsigned lazy_fds(int *out, unsigned max);
void lazy_server_start(int status_fd);
pid_t lazy_server_pid(void);
void lazy_server_forget(void);
void lazy_server_wait(void);
void lazy_close_requests(void);
void lazy_attach(struct image *img);
int lazy_new_uffd(void);

/* lazy_server.c */
int lazy_serve(struct image *imgs, unsigned expected, int requests, int keeper, int keeper_send,
	       int status_fd) __attribute__((noreturn));

/* state/aio.c */
void aio_read_rings(struct image *img);
void aio_restore_ring(const struct loaded_vma *lv);
void aio_submit_again(const struct image *img);
void relock_memory(const struct image *img);
void check_capabilities(const struct image *img);
void check_credentials(const struct image *img);
void restore_async_owners(const struct image *img);

/* state/time_wait.c */
struct sockaddr;
int end_time_wait(const struct sockaddr *local);

/* state/process.c */
void restore_process_early(struct image *img);
void restore_process_late(struct image *img, const struct restart_args *args);

/* threads.c */
long clone3_run(void *args, size_t size, int (*fn)(void *), void *arg);
void restore_threads(struct image *img) __attribute__((noreturn));
void restore_posix_timers(const struct ckpt_process *p);
void restore_thread_pending(const struct image *img, const struct ckpt_thread *thread);
unsigned mapped_file_fds(const struct image *img);
void make_exited_pidfd(void);

/* state/ptys.c: pseudo-terminals with both ends in the job */
void ptys_create(struct image *imgs, unsigned n);
int pty_end(uint64_t id, int master);
unsigned pty_fds(int *out, unsigned max);
void ptys_close(void);
void pty_take_controlling(const struct ckpt_process *p, pid_t pid);
void tty_settings_restore(int fd, const struct loaded_fd *lf);

/* state/mqueues.c */
void mqueues_create(struct image *imgs, unsigned n);
int open_mqueue(const struct ckpt_fd *f);
void restore_mq_notify(const struct image *img);
unsigned mqueue_fds(int *out, unsigned max);
void mqueues_close(void);

/* state/sysv_ipc.c */
void sysv_ipc_check(const struct image *img, const struct sysv_object *o);
void sysv_ipc_create(struct image *imgs, unsigned n);

#endif
