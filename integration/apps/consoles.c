/*
 * Terminals that are devices of the host, not of the job: a virtual
 * console (/dev/tty5) and the system console, held open beside the
 * program's stdio, as a kiosk program or a console logger holds them.
 * After a restart each fd is that device again (not the restarter's
 * terminal, not /dev/null), with the console's settings as the program
 * left them, and none of them became the controlling terminal.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <termios.h>
#include "zdtm.h"

static void is_device(int fd, unsigned maj, unsigned min, const char *what)
{
	struct stat st;

	zdtm_check(fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == maj &&
		   minor(st.st_rdev) == min, "%s is device %u:%u, not %u:%u", what,
		   major(st.st_rdev), minor(st.st_rdev), maj, min);
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	struct termios set, got;
	int vt, console;
	uint64_t hash;

	zdtm_args(argc, argv, &steps, &pace);
	setsid();	/* a session leader: an open without O_NOCTTY would take a terminal */
	vt = open("/dev/tty5", O_RDWR | O_NOCTTY);
	console = open("/dev/console", O_WRONLY | O_NOCTTY);
	zdtm_check(vt >= 0 && console >= 0, "opening the consoles: %s", strerror(errno));
	zdtm_check(tcgetattr(vt, &set) == 0, "tcgetattr: %s", strerror(errno));
	set.c_lflag ^= ECHOCTL;		/* a setting of the program's own */
	zdtm_check(tcsetattr(vt, TCSANOW, &set) == 0, "tcsetattr: %s", strerror(errno));
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(0, steps, pace);
	zdtm_hold();
	is_device(vt, 4, 5, "the virtual console's fd");
	is_device(console, 5, 1, "the console's fd");
	zdtm_check(tcgetattr(vt, &got) == 0 && got.c_lflag == set.c_lflag,
		   "the virtual console's settings changed");
	zdtm_check(open("/dev/tty", O_RDWR) < 0, "a controlling terminal was taken");
	set.c_lflag ^= ECHOCTL;		/* the console as it was */
	tcsetattr(vt, TCSANOW, &set);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
