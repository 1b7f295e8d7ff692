/*
 * ckpt-remote: how processes a job starts through ssh, rsh or srun join
 * the job.
 *
 * The shim runs `ckpt-remote --ssh PROGRAM ARGS...` in place of a job
 * process's exec of ssh or rsh.  That client (client.c) still uses the real
 * program, from outside the job, but only to start `ckpt-remote --serve`
 * on the remote host, inside the job (LD_PRELOAD and CKPT_* set on its
 * command line).  The server (server.c) connects four TCP sockets back to
 * the client (stdin, stdout, stderr, control), detaches from sshd and runs
 * the command with the first three as its stdio.  From then on the client
 * relays its own stdio over those sockets and returns the command's exit
 * status, as ssh would: every connection is between two processes of the
 * job, so a checkpoint saves them and a restart reconnects them, with no
 * ssh session to keep alive.
 *
 * srun (`ckpt-remote --srun PROGRAM ARGS...`) is the same with one server
 * per task: srun runs `ckpt-remote --serve-task HOST:PORT COMMAND...` as
 * each task, the token and the job's variables in its environment.  A
 * task cannot detach (Slurm ends what a step leaves behind), so the server
 * stays the task's process; srun stays outside the job, and a restart,
 * which brings back the client and the servers, does without it.
 */
#ifndef CKPT_REMOTE_H
#define CKPT_REMOTE_H

#include <stddef.h>
#include <sys/types.h>
#include "ckpt_io.h"

#define TOKEN_LEN 32		/* hex digits of a 128-bit random token */
#define TOKEN_VARIABLE "CKPT_REMOTE_TOKEN"	/* how srun hands it to its tasks */

/* A server's first bytes on each connection: the token, the role as a
 * digit, its task's number and the number of tasks (8 hex digits each;
 * through ssh, task 0 of 1). */
#define HELLO_LEN (TOKEN_LEN + 1 + 16)

/* The connections, named by the role byte sent after the token. */
enum remote_role { ROLE_STDIN, ROLE_STDOUT, ROLE_STDERR, ROLE_CONTROL, ROLE_COUNT };

/* Where the remote command is in an ssh or rsh command line. */
struct shell_args {
	int host;		/* index of the host argument */
	int command;		/* index of its first word, 0 when there is none */
	int wrappable;		/* 0: an interactive or control use, run as is */
	int no_stdin;		/* -n: the command's stdin is /dev/null */
	char **shell_argv;	/* the words before the command, without -n */
};

/* shell_args.c */
void shell_args_parse(int argc, char **argv, int rsh, struct shell_args *out);

/* srun_args.c: index of the command in an srun command line, 0 if none */
int srun_command_index(int argc, char **argv);

/* client.c, server.c */
int client_main(const char *program, int argc, char **argv, int rsh);
int srun_client_main(const char *program, int argc, char **argv);
int server_main(const char *back, const char *command);
int server_task_main(const char *back, char **argv);

/* host_agent.c: the job's agent serves this host, then the shim loads */
void host_join_job(char **argv);

/* net.c */
int net_read_all(int fd, void *buf, size_t len, int timeout_ms);
int net_relay(int from, int to);

/* plugin.c: refuses checkpoints while the remote side is being started */
void remote_plugin_init(void);
void remote_set_starting(int starting);

/* pmi_proxy.c: an srun task's PMI connection, relayed, and answered after
 * a restart */
struct pollfd;
void pmi_proxy_prepare(unsigned rank, unsigned ntasks);
void pmi_proxy_started(void);
int pmi_proxy_pollfds(struct pollfd *p);	/* at most 2 */
void pmi_proxy_serve(const struct pollfd *p, int n, pid_t task);
int pmi_proxy_busy(void);
const char *pmi_proxy_unsupported(void);
int pmi_proxy_restarted(unsigned seq, char *why, size_t size);

void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

#endif
