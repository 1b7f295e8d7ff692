/*
 * Finds the host and the remote command in an ssh or rsh command line.
 * OpenSSH takes options before and after the host; the first word after
 * the host that is not an option starts the command.
 */
#include <stdlib.h>
#include <string.h>
#include "remote.h"

/* OpenSSH 9 options that take an argument, and those that mean the
 * command line starts no remote command we could run (forwarding only,
 * background, control requests, queries, subsystems, a terminal: the
 * token on stdin would be echoed). */
static const char ssh_with_arg[] = "BbcDEeFIiJLlmOoPpQRSWw";
static const char ssh_no_command[] = "NfGOQstVW";
/* rsh (netkit, BSD): -l user, -p port, -k realm */
static const char rsh_with_arg[] = "lpk";

/*
 * Copies the option group at argv[i] to the shell's words without -n (its
 * stdin carries the server's token; the client gives the command no stdin
 * instead).  Returns how many extra words the group consumed.
 */
static int option_group(char **argv, int i, int argc, int rsh, struct shell_args *out,
			int *k)
{
	const char *with_arg = rsh ? rsh_with_arg : ssh_with_arg;
	char *copy = strdup(argv[i]), *w = copy + 1;
	int extra = 0;

	for (const char *c = argv[i] + 1; *c; c++) {
		if (!rsh && strchr(ssh_no_command, *c))
			out->wrappable = 0;
		if (strchr(with_arg, *c)) {
			strcpy(w, c);
			w += strlen(w);
			extra = c[1] ? 0 : (i + 1 < argc ? 1 : 0);
			break;
		}
		if (*c == 'n')
			out->no_stdin = 1;
		else
			*w++ = *c;
	}
	*w = 0;
	if (copy[1])
		out->shell_argv[(*k)++] = copy;
	if (extra)
		out->shell_argv[(*k)++] = argv[i + 1];
	return extra;
}

void shell_args_parse(int argc, char **argv, int rsh, struct shell_args *out)
{
	int options_ended = 0, k = 0;

	out->host = 0;
	out->command = 0;
	out->wrappable = 1;
	out->no_stdin = 0;
	out->shell_argv = calloc(argc + 2, sizeof(char *));
	if (!out->shell_argv)
		die("out of memory");
	out->shell_argv[k++] = argv[0];
	for (int i = 1; i < argc; i++) {
		if (!options_ended && !strcmp(argv[i], "--")) {
			options_ended = 1;
			out->shell_argv[k++] = argv[i];
		} else if (!options_ended && argv[i][0] == '-' && argv[i][1]) {
			i += option_group(argv, i, argc, rsh, out, &k);
		} else if (!out->host) {
			out->host = i;
			out->shell_argv[k++] = argv[i];
		} else {
			out->command = i;
			break;
		}
	}
	if (!out->host || !out->command)
		out->wrappable = 0;
}
