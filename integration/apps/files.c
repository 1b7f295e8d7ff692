/* Files: one written at known offsets (sequential write()s and pwrite()s),
 * one deleted while open and still written and read, /dev/null, and a pipe
 * inside the process with bytes sitting in it across the checkpoint. */
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include "zdtm.h"

#define REC 64

static void record(long step, char *buf)
{
	uint64_t h = zdtm_mix(0, step);

	for (int i = 0; i < REC; i++) {
		h = zdtm_mix(h, i);
		buf[i] = 'a' + h % 26;
	}
}

int main(int argc, char **argv)
{
	long steps = 200, pace = 10;
	char buf[REC], got[REC], pipebuf[4096];
	int data, tmp, null, p[2];
	uint64_t hash = 0;
	struct stat st;

	zdtm_args(argc, argv, &steps, &pace);
	if (argc > 3)
		zdtm_check(chdir(argv[3]) == 0, "chdir %s", argv[3]);
	data = open("data.bin", O_RDWR | O_CREAT | O_TRUNC, 0644);
	tmp = open("deleted.tmp", O_RDWR | O_CREAT | O_TRUNC, 0600);
	null = open("/dev/null", O_WRONLY);
	zdtm_check(data >= 0 && tmp >= 0 && null >= 0 && pipe(p) == 0, "open");
	zdtm_check(unlink("deleted.tmp") == 0, "unlink");
	for (int i = 0; i < (int)sizeof(pipebuf); i++)
		pipebuf[i] = (char)(i * 7);
	zdtm_check(write(p[1], pipebuf, sizeof(pipebuf)) == sizeof(pipebuf), "pipe write");
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		record(step, buf);
		zdtm_check(write(data, buf, REC) == REC, "write");
		zdtm_check(pwrite(data, buf, 8, 1000000 + step * 8) == 8, "pwrite");
		zdtm_check(write(tmp, buf, REC) == REC, "write deleted");
		zdtm_check(write(null, buf, REC) == REC, "write /dev/null");
		if (step % 50 == 49) {	/* take a little out of the pipe */
			char c[16];

			zdtm_check(read(p[0], c, 16) == 16, "pipe read");
			for (int i = 0; i < 16; i++)
				zdtm_check(c[i] == pipebuf[(step / 50) * 16 + i], "pipe byte");
		}
		zdtm_pace(pace);
	}
	zdtm_hold();
	zdtm_check(lseek(data, 0, SEEK_CUR) == steps * REC, "data offset %ld",
		   (long)lseek(data, 0, SEEK_CUR));
	zdtm_check(lseek(tmp, 0, SEEK_CUR) == steps * REC, "deleted file offset");
	zdtm_check(fstat(tmp, &st) == 0 && st.st_nlink == 0 && st.st_size == steps * REC,
		   "deleted file: nlink %ld size %ld", (long)st.st_nlink, (long)st.st_size);
	for (long step = 0; step < steps; step++) {
		record(step, buf);
		zdtm_check(pread(data, got, REC, step * REC) == REC && !memcmp(got, buf, REC),
			   "data record %ld", step);
		zdtm_check(pread(data, got, 8, 1000000 + step * 8) == 8 && !memcmp(got, buf, 8),
			   "data pwrite %ld", step);
		zdtm_check(pread(tmp, got, REC, step * REC) == REC && !memcmp(got, buf, REC),
			   "deleted record %ld", step);
		hash = zdtm_mix(hash, got[0] + step);
	}
	{
		long consumed = (steps / 50) * 16, left = sizeof(pipebuf) - consumed;
		char rest[sizeof(pipebuf)];

		zdtm_check(read(p[0], rest, left) == left, "pipe remainder");
		for (long i = 0; i < left; i++)
			zdtm_check(rest[i] == pipebuf[consumed + i], "pipe byte %ld", consumed + i);
	}
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
