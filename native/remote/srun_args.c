/*
 * Finds the command in an srun command line: srun's options come first
 * (getopt stops at the first word that is not an option), the command and
 * its arguments after.  An option's value may be in the same word
 * (--nodes=2, -N2) or the next (--nodes 2, -N 2); the tables say which
 * options take one (Slurm 22.05's srun).
 */
#include <string.h>
#include "remote.h"

/* Short options with a value in the next word when not in this one
 * (-I and -K take theirs only in the same word). */
static const char srun_short_with_arg[] = "AbcCdDeGiJLmMnNopqrStTwWx";

/* Long options whose value may be the next word. */
static const char *const srun_long_with_arg[] = {
	"account", "acctg-freq", "bb", "bbf", "bcast-exclude", "begin", "chdir",
	"cluster-constraint", "clusters", "comment", "constraint", "container",
	"core-spec", "cores-per-socket", "cpu-bind", "cpu-freq", "cpus-per-gpu",
	"cpus-per-task", "deadline", "delay-boot", "dependency", "distribution",
	"epilog", "error", "exclude", "export", "gpu-bind", "gpu-freq", "gpus",
	"gpus-per-node", "gpus-per-socket", "gpus-per-task", "gres", "gres-flags",
	"het-group", "hint", "input", "job-name", "jobid", "licenses", "mail-type",
	"mail-user", "mcs-label", "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu",
	"mincpus", "mpi", "network", "nodefile", "nodelist", "nodes", "ntasks",
	"ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node", "ntasks-per-socket",
	"open-mode", "output", "partition", "power", "priority", "profile", "prolog",
	"qos", "relative", "reservation", "signal", "slurmd-debug", "sockets-per-node",
	"switches", "task-epilog", "task-prolog", "thread-spec", "threads",
	"threads-per-core", "time", "time-min", "tmp", "uid", "gid", "wait", "wckey",
	NULL,
};

static int long_takes_arg(const char *name)
{
	for (const char *const *o = srun_long_with_arg; *o; o++)
		if (!strcmp(name, *o))
			return 1;
	return 0;
}

/* Words used by the option at argv[i] (1 or 2). */
static int option_words(const char *word, int has_next)
{
	if (word[1] == '-') {
		if (strchr(word, '='))
			return 1;
		return long_takes_arg(word + 2) && has_next ? 2 : 1;
	}
	for (const char *c = word + 1; *c; c++)
		if (strchr(srun_short_with_arg, *c))
			return !c[1] && has_next ? 2 : 1;
	return 1;
}

int srun_command_index(int argc, char **argv)
{
	for (int i = 1; i < argc;) {
		if (!strcmp(argv[i], "--"))
			return i + 1 < argc ? i + 1 : 0;
		if (argv[i][0] != '-' || !argv[i][1])
			return i;
		i += option_words(argv[i], i + 1 < argc);
	}
	return 0;
}
