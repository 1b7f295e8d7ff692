/* ckpt-remote: ssh, rsh and srun inside a checkpointed job (see remote.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "remote.h"

void die(const char *fmt, ...)
{
	va_list ap;

	fputs("ckpt-remote: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(255);
}

static void usage(void)
{
	fputs("usage: ckpt-remote --ssh|--rsh|--srun PROGRAM [ARGS...]   (the shim runs it\n"
	      "                                                  for ssh, rsh and srun)\n"
	      "       ckpt-remote --serve HOST:PORT COMMAND\n"
	      "       ckpt-remote --serve-task HOST:PORT PROGRAM [ARGS...]\n", stderr);
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc >= 3 && (!strcmp(argv[1], "--ssh") || !strcmp(argv[1], "--rsh")))
		return client_main(argv[2], argc - 2, argv + 2, !strcmp(argv[1], "--rsh"));
	if (argc >= 3 && !strcmp(argv[1], "--srun"))
		return srun_client_main(argv[2], argc - 2, argv + 2);
	if (argc >= 4 && !strcmp(argv[1], "--serve-task")) {
		host_join_job(argv);
		return server_task_main(argv[2], argv + 3);
	}
	if (argc == 4 && !strcmp(argv[1], "--serve")) {
		host_join_job(argv);
		return server_main(argv[2], argv[3]);
	}
	usage();
}
