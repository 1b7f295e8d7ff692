/*
 * exec: the program a process of the job executes must load the shim and
 * find the job's coordinator, even when the caller scrubbed its
 * environment (env -i, launchers that pass a fixed environment) and after
 * a restart, when the inherited CKPT_COORD names the old coordinator.
 * Every exec function of glibc that takes or uses an environment is
 * wrapped; the environment is rebuilt on the stack (a vfork child must not
 * allocate), with LD_PRELOAD, CKPT_COORD and CKPT_JOB_ID set, and the
 * variables that let ckpt-remote join the job on another host (the
 * coordinator's TCP address, the secret's path, the agent's program).
 *
 * posix_spawn and posix_spawnp get the same treatment.
 *
 * ssh and rsh are the way launchers start processes on other hosts: their
 * exec runs ckpt-remote (next to this library) instead, which starts the
 * remote command inside the job (native/remote/remote.h).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "shim.h"

#define VAR_MAX 4200

extern char **environ;

static char shim_path[CKPT_PATH_MAX];
static char remote_path[CKPT_PATH_MAX];
static char flusher_path[CKPT_PATH_MAX];
static char job_id[64];
/* "NAME=value" as the process found them at load, or "" */
static const char *const host_var_names[] = { "CKPT_COORD_TCP", "CKPT_SECRET_FILE", "CKPT_AGENT" };
#define HOST_VARS (sizeof(host_var_names) / sizeof(host_var_names[0]))
static char host_vars[HOST_VARS][CKPT_PATH_MAX + 32];

/* At load: where this library is, and the job's id. */
void exec_follow_init(void)
{
	Dl_info info;
	const char *id = getenv("CKPT_JOB_ID");

	if (dladdr((void *)exec_follow_init, &info) && info.dli_fname) {
		const char *slash = strrchr(info.dli_fname, '/');
		int dir = slash ? (int)(slash - info.dli_fname + 1) : 0;

		snprintf(shim_path, sizeof(shim_path), "%s", info.dli_fname);
		snprintf(remote_path, sizeof(remote_path), "%.*sckpt-remote", dir,
			 info.dli_fname);
		if (access(remote_path, X_OK))
			remote_path[0] = 0;
		snprintf(flusher_path, sizeof(flusher_path), "%.*sckpt-flush", dir,
			 info.dli_fname);
	}
	snprintf(job_id, sizeof(job_id), "%s", id ? id : "");
	for (size_t i = 0; i < HOST_VARS; i++) {
		const char *value = getenv(host_var_names[i]);

		host_vars[i][0] = 0;
		if (value)
			snprintf(host_vars[i], sizeof(host_vars[i]), "%s=%s", host_var_names[i], value);
	}
}

/* ckpt-flush, beside this library (staged checkpoints: writer.c). */
const char *exec_flusher_path(void)
{
	return flusher_path;
}

/* "/libckpt.so" as /proc/<pid>/maps shows it, "" before exec_follow_init. */
const char *exec_shim_name(void)
{
	const char *slash = strrchr(shim_path, '/');

	return slash ? slash : "";
}

/* "--ssh", "--rsh" or "--srun" when path names one of them, else NULL. */
static const char *remote_shell(const char *path)
{
	const char *base = strrchr(path, '/');

	base = base ? base + 1 : path;
	if (!remote_path[0])
		return NULL;
	if (!strcmp(base, "ssh"))
		return "--ssh";
	if (!strcmp(base, "rsh"))
		return "--rsh";
	if (!strcmp(base, "srun"))
		return "--srun";
	return NULL;
}

/* ckpt-remote FLAG PATH ARGS... in out (room for argv's count + 3). */
static void remote_argv(char **out, const char *flag, const char *path, char *const argv[])
{
	size_t k = 0;

	out[k++] = "ckpt-remote";
	out[k++] = (char *)flag;
	out[k++] = (char *)path;
	for (size_t i = 1; argv && argv[0] && argv[i]; i++)
		out[k++] = argv[i];
	out[k] = NULL;
}

static int has_name(const char *entry, const char *name)
{
	size_t n = strlen(name);

	return !strncmp(entry, name, n) && entry[n] == '=';
}

/* LD_PRELOAD as the caller had it, with the shim first if it was missing. */
static void preload_var(char *out, size_t size, char *const envp[])
{
	const char *old = NULL;

	for (size_t i = 0; envp && envp[i]; i++)
		if (has_name(envp[i], "LD_PRELOAD"))
			old = envp[i] + strlen("LD_PRELOAD=");
	if (old && strstr(old, shim_path))
		snprintf(out, size, "LD_PRELOAD=%s", old);
	else if (old && *old)
		snprintf(out, size, "LD_PRELOAD=%s:%s", shim_path, old);
	else
		snprintf(out, size, "LD_PRELOAD=%s", shim_path);
}

static int is_host_var(const char *entry)
{
	for (size_t i = 0; i < HOST_VARS; i++)
		if (has_name(entry, host_var_names[i]))
			return 1;
	return 0;
}

/* Fills env (room for n + ENV_EXTRA entries) from envp plus the job's variables. */
#define ENV_EXTRA (4 + HOST_VARS)
static void job_environment(char **env, char *const envp[], char *preload, char *coord,
			    char *job)
{
	size_t k = 0;

	for (size_t i = 0; envp && envp[i]; i++)
		if (!has_name(envp[i], "LD_PRELOAD") && !has_name(envp[i], "CKPT_COORD") &&
		    !has_name(envp[i], "CKPT_JOB_ID") && !is_host_var(envp[i]))
			env[k++] = envp[i];
	for (size_t i = 0; i < HOST_VARS; i++)
		if (host_vars[i][0])
			env[k++] = host_vars[i];
	preload_var(preload, VAR_MAX, envp);
	snprintf(coord, VAR_MAX, "CKPT_COORD=%s", checkpointer_coord_path());
	snprintf(job, 128, "CKPT_JOB_ID=%s", job_id);
	env[k++] = preload;
	env[k++] = coord;
	env[k++] = job;
	env[k] = NULL;
}

static size_t count(char *const v[])
{
	size_t n = 0;

	while (v && v[n])
		n++;
	return n;
}

typedef int (*execve_fn)(const char *, char *const[], char *const[]);

/* The job's environment on the stack, then the real function. */
#define WITH_JOB_ENV(envp, call)						\
	do {									\
		char preload_[VAR_MAX], coord_[VAR_MAX], job_[128];		\
		char **env_ = alloca((count(envp) + ENV_EXTRA) * sizeof(char *)); \
										\
		if (!shim_path[0])						\
			break;							\
		job_environment(env_, envp, preload_, coord_, job_);		\
		return call;							\
	} while (0)

/* path_ and argv_: ckpt-remote and its arguments for ssh or rsh (on the
 * stack), else path and argv as they were. */
#define REMOTE_SHELL_ARGS(path, argv)						\
	const char *flag_ = remote_shell(path);				\
	const char *path_ = flag_ ? remote_path : (path);			\
	char **argv_ = flag_ ? alloca((count(argv) + 3) * sizeof(char *))	\
			     : (char **)(argv);					\
	if (flag_)								\
		remote_argv(argv_, flag_, path, argv)

SHIM_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	static execve_fn real;
	REMOTE_SHELL_ARGS(path, argv);

	if (!real)
		real = (execve_fn)dlsym(RTLD_NEXT, "execve");
	WITH_JOB_ENV(envp, real(path_, argv_, env_));
	return real(path, argv, envp);
}

SHIM_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	static execve_fn real;
	REMOTE_SHELL_ARGS(file, argv);

	if (!real)
		real = (execve_fn)dlsym(RTLD_NEXT, "execvpe");
	WITH_JOB_ENV(envp, real(path_, argv_, env_));
	return real(file, argv, envp);
}

/* posix_spawn execs inside glibc, past the wrappers above: the child's
 * environment and program are set here, before it is made. */
typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
			const posix_spawnattr_t *, char *const[], char *const[]);

SHIM_EXPORT int posix_spawn(pid_t *pid, const char *path,
			    const posix_spawn_file_actions_t *actions,
			    const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	static spawn_fn real;
	REMOTE_SHELL_ARGS(path, argv);

	if (!real)
		real = (spawn_fn)dlsym(RTLD_NEXT, "posix_spawn");
	WITH_JOB_ENV(envp, real(pid, path_, actions, attr, argv_, env_));
	return real(pid, path, actions, attr, argv, envp);
}

SHIM_EXPORT int posix_spawnp(pid_t *pid, const char *file,
			     const posix_spawn_file_actions_t *actions,
			     const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	static spawn_fn real;
	REMOTE_SHELL_ARGS(file, argv);

	if (!real)
		real = (spawn_fn)dlsym(RTLD_NEXT, "posix_spawnp");
	WITH_JOB_ENV(envp, real(pid, path_, actions, attr, argv_, env_));
	return real(pid, file, actions, attr, argv, envp);
}

SHIM_EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	static int (*real)(int, char *const[], char *const[]);

	if (!real)
		real = (int (*)(int, char *const[], char *const[]))dlsym(RTLD_NEXT, "fexecve");
	WITH_JOB_ENV(envp, real(fd, argv, env_));
	return real(fd, argv, envp);
}

/* glibc's own execv, execvp and execl* call its internal execve: */
SHIM_EXPORT int execv(const char *path, char *const argv[])
{
	return execve(path, argv, environ);
}

SHIM_EXPORT int execvp(const char *file, char *const argv[])
{
	return execvpe(file, argv, environ);
}

/* execl, execlp, execle: the arguments into an array on the stack. */
static int exec_list(const char *path, int search, int with_env, const char *arg, va_list ap)
{
	va_list count_ap;
	char **argv, *const *envp = environ;
	size_t n = arg ? 1 : 0;

	va_copy(count_ap, ap);
	while (n && va_arg(count_ap, char *))
		n++;
	va_end(count_ap);
	argv = alloca((n + 1) * sizeof(char *));
	argv[0] = (char *)arg;
	for (size_t i = 1; i < n; i++)
		argv[i] = va_arg(ap, char *);
	argv[n] = NULL;
	if (with_env) {
		if (n)
			(void)va_arg(ap, char *);	/* the terminating NULL */
		envp = va_arg(ap, char *const *);
	}
	return search ? execvpe(path, argv, envp) : execve(path, argv, envp);
}

SHIM_EXPORT int execl(const char *path, const char *arg, ...)
{
	va_list ap;
	int r;

	va_start(ap, arg);
	r = exec_list(path, 0, 0, arg, ap);
	va_end(ap);
	return r;
}

SHIM_EXPORT int execlp(const char *file, const char *arg, ...)
{
	va_list ap;
	int r;

	va_start(ap, arg);
	r = exec_list(file, 1, 0, arg, ap);
	va_end(ap);
	return r;
}

SHIM_EXPORT int execle(const char *path, const char *arg, ...)
{
	va_list ap;
	int r;

	va_start(ap, arg);
	r = exec_list(path, 0, 1, arg, ap);
	va_end(ap);
	return r;
}
