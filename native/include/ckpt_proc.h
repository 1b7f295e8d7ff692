/*
 * The /proc helpers every native part shares (native/common/proc.c): a
 * directory walker and a /proc/<pid>/stat reader.  Both run where no libc
 * state may be touched (the checkpoint thread while the application is
 * parked, ckpt-restart): no malloc, no stdio, no locale, buffers on the stack.
 */
#ifndef CKPT_PROC_H
#define CKPT_PROC_H

#include <stdint.h>
#include <sys/types.h>

/* Up to size bytes of path into buf (not terminated); length or -errno. */
ssize_t ckpt_read_file(const char *path, char *buf, size_t size);

/*
 * fn(dfd, name, ino, arg) for each entry of the directory path but "." and
 * "..", through getdents64 (opendir mallocs).  The walk stops at fn's first
 * nonzero return, which it returns; 0 at the end; -errno if path cannot be
 * opened.
 */
typedef int (*ckpt_dir_fn)(int dfd, const char *name, uint64_t ino, void *arg);
int ckpt_dir_walk(const char *path, ckpt_dir_fn fn, void *arg);

/* The fields of /proc/<pid>/stat after the command's ')' that we use
 * (proc(5) numbers them from 1). */
struct ckpt_proc_stat {
	char state;			/* 3 */
	int ppid, pgid, session;	/* 4-6 */
	unsigned tty_nr;		/* 7 */
	int tpgid;			/* 8 */
	uint64_t starttime;		/* 22 */
	uint64_t start_code, end_code, start_stack;	/* 26-28 */
	uint64_t start_data, end_data, start_brk;	/* 45-47 */
	uint64_t arg_start, arg_end, env_start, env_end; /* 48-51 */
	int exit_code;			/* 52 */
	int last_field;			/* the last field there (an old kernel has fewer) */
};

/* Parse a stat line (terminated): 0, or EIO if it has no ')'. */
int ckpt_stat_parse(const char *line, struct ckpt_proc_stat *st);
/* Read and parse the stat file at path ("/proc/<pid>/stat",
 * "/proc/self/task/<tid>/stat"): 0, -errno or EIO. */
int ckpt_stat_read(const char *path, struct ckpt_proc_stat *st);
/* Same, of process pid. */
int ckpt_stat_read_pid(pid_t pid, struct ckpt_proc_stat *st);

/* Whether path is a file of a thread, /proc/<pid>/task/<tid> or below it:
 * then its pid and tid. */
int ckpt_task_path(const char *path, long *pid, long *tid);

#endif
