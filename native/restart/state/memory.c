/*
 * Replacing the address space: check everything that can fail (vDSO
 * layout, mapped files), then unmap all but the reserved range and the
 * vDSO, move the new kernel's vDSO block onto the saved addresses, and map
 * every saved region back, reading its pages straight into place.
 *
 * From prepare_memory()'s end on, the old address space is gone: only raw
 * system calls and code inside this binary may be used.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "restart.h"
#include "sys.h"
#include "linux_compat.h"

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif
#define MAX_CUR 4096
#define VDSO_PARTS 4
#define ZONE_VDSO_TMP (CKPT_RESERVE_START + 0x68000000UL)

struct span {
	uint64_t start, end;
	char name[16];
};

struct vdso_block {
	struct span part[VDSO_PARTS];
	unsigned n;
};

static struct span cur[MAX_CUR];
static unsigned ncur;
static struct vdso_block cur_vdso, saved_vdso;
static int *file_fds;			/* per vma: an open mapped file, or -1 */
static unsigned char *file_fd_owned;	/* per vma: its file_fds[] is its own */

static int is_vdso_name(const char *n)
{
	return !strcmp(n, "[vdso]") || !strcmp(n, "[vvar]") || !strcmp(n, "[vvar_vclock]");
}

static void read_current_maps(void)
{
	char *buf = arena_alloc(1 << 20);
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	size_t len = 0;
	ssize_t n;

	if (fd < 0)
		die("cannot read /proc/self/maps: %s", strerror(errno));
	while ((n = read(fd, buf + len, (1 << 20) - 1 - len)) > 0)
		len += n;
	close(fd);
	buf[len] = '\0';
	for (char *line = buf; *line && ncur < MAX_CUR;) {
		char *nl = strchr(line, '\n');
		unsigned long long s, e;
		char name[64] = "";

		if (nl)
			*nl = '\0';
		if (sscanf(line, "%llx-%llx %*s %*s %*s %*s %63s", &s, &e, name) >= 2) {
			cur[ncur].start = s;
			cur[ncur].end = e;
			snprintf(cur[ncur].name, sizeof(cur[ncur].name), "%s", name);
			if (is_vdso_name(name) && cur_vdso.n < VDSO_PARTS)
				cur_vdso.part[cur_vdso.n++] = cur[ncur];
			ncur++;
		}
		if (!nl)
			break;
		line = nl + 1;
	}
}

static void check_vdso(struct image *img)
{
	for (unsigned i = 0; i < img->nvmas; i++) {
		const struct loaded_vma *lv = &img->vmas[i];

		if (lv->v.kind != CKPT_VMA_VDSO || saved_vdso.n == VDSO_PARTS)
			continue;
		saved_vdso.part[saved_vdso.n].start = lv->v.start;
		saved_vdso.part[saved_vdso.n].end = lv->v.end;
		snprintf(saved_vdso.part[saved_vdso.n].name, 16, "%s", lv->path);
		saved_vdso.n++;
	}
	if (saved_vdso.n != cur_vdso.n)
		die("the vDSO of this kernel differs from the image's (%u parts, image has %u)",
		    cur_vdso.n, saved_vdso.n);
	for (unsigned i = 0; i < cur_vdso.n; i++) {
		const struct span *c = &cur_vdso.part[i], *s = &saved_vdso.part[i];

		if (strcmp(c->name, s->name) || c->end - c->start != s->end - s->start ||
		    c->start - cur_vdso.part[0].start != s->start - saved_vdso.part[0].start)
			die("the vDSO of this kernel differs from the image's (%s)", c->name);
	}
}

static int in_zone(uint64_t start, uint64_t end)
{
	return start >= CKPT_RESERVE_START && end <= CKPT_RESERVE_END;
}

/* The name a memfd standing in for the file at path gets: a memfd's own
 * ("/memfd:NAME (deleted)"), else the file's base name. */
void memfd_name_of(const char *path, char name[MEMFD_NAME_MAX])
{
	const char *p = path;
	size_t n;

	p = !strncmp(p, "/memfd:", 7) ? p + 7 : (strrchr(p, '/') ? strrchr(p, '/') + 1 : p);
	snprintf(name, MEMFD_NAME_MAX, "%s", p);
	n = strlen(name);
	if (n > 10 && !strcmp(name + n - 10, " (deleted)"))
		name[n - 10] = '\0';
}

/*
 * An unlinked file that a map shows ("/dir/name (deleted)"; not a memfd,
 * nor MAP_SHARED | MAP_ANONYMOUS memory, "/dev/zero (deleted)"): made
 * again, empty, under its name and unlinked at once, so that maps and fds
 * name it as before.  -1 when the name is taken or its directory gone.
 */
int unlinked_file_again(const char *name)
{
	const char *suffix = " (deleted)";
	size_t n = name ? strlen(name) : 0, k = strlen(suffix);
	char path[CKPT_PATH_MAX];
	int fd;

	if (n <= k || name[0] != '/' || strcmp(name + n - k, suffix) ||
	    !strncmp(name, "/memfd:", 7) || !strcmp(name, "/dev/zero (deleted)") ||
	    n - k >= sizeof(path))
		return -1;
	snprintf(path, sizeof(path), "%.*s", (int)(n - k), name);
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd >= 0)
		unlink(path);
	return fd;
}

/*
 * The stand-in for an unlinked file mapped privately: the file made again
 * (else a memfd named after it) as long as it was (to a page).  Its pages
 * are zero; the saved ones are read over them as private copies.
 */
static int deleted_file_stand_in(const struct loaded_vma *lv)
{
	char name[MEMFD_NAME_MAX];
	int fd, high;

	memfd_name_of(lv->path, name);
	fd = unlinked_file_again(lv->path);
	if (fd < 0)
		fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0 && errno == EACCES)	/* vm.memfd_noexec = 2 */
		fd = memfd_create(name, MFD_CLOEXEC | MFD_NOEXEC_SEAL);
	if (fd < 0 || ftruncate(fd, lv->v.file_size))
		die("mapped unlinked file %s: a memfd of %llu bytes: %s", lv->path,
		    (unsigned long long)lv->v.file_size, strerror(errno));
	high = fcntl(fd, F_DUPFD_CLOEXEC, restart_fd_base());
	if (high < 0)
		die("mapped unlinked file %s: %s", lv->path, strerror(errno));
	close(fd);
	return high;
}

/*
 * The unlinked file (or memfd) itself, when the job still has it: a shared
 * map of it made it again (shared.c), or an fd of this process did
 * (restore_fds() ran before).  Read-only: the map is private.  Else -1.
 */
static int deleted_file_object(const struct image *img, const struct loaded_vma *lv)
{
	char path[64];
	int fd = -1, high;

	if (!lv->v.shm_id)
		return -1;
	if (shared_shm_fd(lv->v.shm_id) >= 0)
		snprintf(path, sizeof(path), "/proc/self/fd/%d", shared_shm_fd(lv->v.shm_id));
	else {
		unsigned j;

		for (j = 0; j < img->nfds; j++)
			if (img->fds[j].f.kind == CKPT_FD_DELETED_FILE &&
			    img->fds[j].f.object_id == lv->v.shm_id)
				break;
		if (j == img->nfds)
			return -1;
		snprintf(path, sizeof(path), "/proc/self/fd/%d", img->fds[j].f.fd);
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	high = fcntl(fd, F_DUPFD_CLOEXEC, restart_fd_base());
	close(fd);
	return high;
}

/* The deleted executable (a memfd run by fexecve, or a binary removed
 * while it ran) made again whole, for its regions to map and for
 * /proc/self/exe to name (the shim's restore_exe_link): a memfd. */
static int exe_again(const struct image *img)
{
	const struct loaded_fd *exe = img->exe;
	off_t from = img->exe_data_off;
	char name[MEMFD_NAME_MAX];
	int fd, high;

	memfd_name_of(exe->path, name);
	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0)
		die("the executable %s: a memfd: %s", exe->path, strerror(errno));
	for (uint64_t left = exe->f.data_size; left;) {
		ssize_t n = sendfile(fd, img->fd, &from, left < (1 << 30) ? left : (1 << 30));

		if (n <= 0)
			die("the executable %s: copying it from %s: %s", exe->path, img->file,
			    n ? strerror(errno) : "the image ends first");
		left -= n;
	}
	high = fcntl(fd, F_DUPFD_CLOEXEC, restart_fd_base());
	if (high < 0)
		die("the executable %s: %s", exe->path, strerror(errno));
	close(fd);
	return high;
}

/* An earlier region mapping the deleted executable, or -1. */
static int exe_mapped_before(const struct image *img, unsigned i, const int *fds)
{
	for (unsigned j = 0; j < i; j++)
		if (fds[j] >= 0 && img->vmas[j].v.kind == CKPT_VMA_DELETED_FILE &&
		    img->vmas[j].v.shm_id == img->exe->f.object_id)
			return j;
	return -1;
}

static int is_mapped_file(const struct loaded_vma *lv)
{
	return lv->v.kind == CKPT_VMA_FILE || lv->v.kind == CKPT_VMA_SHARED_FILE;
}

static int needs_write(const struct loaded_vma *lv)
{
	return lv->v.kind == CKPT_VMA_SHARED_FILE && (lv->v.prot & PROT_WRITE);
}

/* An earlier region i of the same file, opened for what vma needs (a
 * writable shared map needs O_RDWR), or -1: one fd per file and mode,
 * however many regions map it. */
static int same_file_before(const struct image *img, unsigned i, const int *fds)
{
	const struct loaded_vma *lv = &img->vmas[i];

	for (unsigned j = i; j-- > 0;) {
		const struct loaded_vma *earlier = &img->vmas[j];

		if (fds[j] >= 0 && is_mapped_file(earlier) && needs_write(earlier) == needs_write(lv) &&
		    !strcmp(earlier->path, lv->path))
			return j;
	}
	return -1;
}

/* How many fds check_files() holds for img: the restart needs room for them. */
unsigned mapped_file_fds(const struct image *img)
{
	int *first = arena_alloc(sizeof(int) * (img->nvmas + 1));
	unsigned n = 0;

	for (unsigned i = 0; i < img->nvmas; i++) {
		const struct loaded_vma *lv = &img->vmas[i];

		first[i] = -1;
		if (lv->v.kind == CKPT_VMA_DELETED_FILE && (lv->v.flags & CKPT_VMA_FILE_END))
			n++;
		else if (is_mapped_file(lv) && same_file_before(img, i, first) < 0)
			first[i] = (int)n++;
	}
	return n;
}

/* Open every file the image maps, and check it is still the same file. */
static void check_files(struct image *img)
{
	file_fds = arena_alloc(sizeof(int) * (img->nvmas + 1));
	file_fd_owned = arena_alloc(img->nvmas + 1);
	for (unsigned i = 0; i < img->nvmas; i++) {
		const struct loaded_vma *lv = &img->vmas[i];
		int shared_rw = needs_write(lv);
		struct stat st;
		int fd, same;

		file_fds[i] = -1;
		file_fd_owned[i] = 1;
		if (lv->v.kind == CKPT_VMA_DELETED_FILE && img->exe &&
		    lv->v.shm_id == img->exe->f.object_id) {
			same = exe_mapped_before(img, i, file_fds);
			file_fds[i] = same >= 0 ? file_fds[same] : exe_again(img);
			file_fd_owned[i] = same < 0;
			continue;
		}
		if (lv->v.kind == CKPT_VMA_DELETED_FILE && (lv->v.flags & CKPT_VMA_FILE_END)) {
			file_fds[i] = deleted_file_object(img, lv);
			if (file_fds[i] < 0 && (lv->v.flags & CKPT_VMA_FILE_PAGES))
				die("mapped unlinked file %s: the file, whose pages its private "
				    "map shows, was not restored", lv->path);
			if (file_fds[i] < 0)
				file_fds[i] = deleted_file_stand_in(lv);
			continue;
		}
		if (!is_mapped_file(lv))
			continue;
		same = same_file_before(img, i, file_fds);
		if (same >= 0) {
			file_fds[i] = file_fds[same];	/* another region of that file */
			file_fd_owned[i] = 0;
			continue;
		}
		fd = open(lv->path, (shared_rw ? O_RDWR : O_RDONLY) | O_CLOEXEC);
		if (fd < 0)
			die("mapped file %s: %s", lv->path, strerror(errno));
		if (fstat(fd, &st))
			die("mapped file %s: %s", lv->path, strerror(errno));
		/* a file the restart wrote back itself (shm.c) is the checkpoint's */
		if (lv->v.kind == CKPT_VMA_FILE && (lv->v.file_size || lv->v.file_mtime_ns) &&
		    !shared_file_rewritten(lv->path) &&
		    ((uint64_t)st.st_size != lv->v.file_size ||
		     (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec !=
			     lv->v.file_mtime_ns))
			die("mapped file %s changed since the checkpoint", lv->path);
		file_fds[i] = fcntl(fd, F_DUPFD_CLOEXEC, restart_fd_base());
		if (file_fds[i] < 0)
			die("mapped file %s: %s", lv->path, strerror(errno));
		close(fd);
	}
}

void prepare_memory(struct image *img)
{
	read_current_maps();
	check_vdso(img);
	check_files(img);
	aio_read_rings(img);
	reader_prepare(img);
}

static void unmap_old(void)
{
	for (unsigned i = 0; i < ncur; i++) {
		const struct span *s = &cur[i];
		long r;

		if (in_zone(s->start, s->end) || is_vdso_name(s->name) ||
		    !strcmp(s->name, "[vsyscall]") || shared_anon_waits_in(s->start, s->end))
			continue;
		r = sys2(SYS_munmap, s->start, s->end - s->start);
		if (r < 0)
			fatal("munmap of the old address space", r);
	}
}

/* Move the vDSO block as one unit, layout kept: via a spot in the zone, so
 * the old and new places may overlap. */
static void move_vdso(void)
{
	uint64_t base = cur_vdso.part[0].start;

	for (int pass = 0; pass < 2; pass++) {
		for (unsigned i = 0; i < cur_vdso.n; i++) {
			const struct span *c = &cur_vdso.part[i];
			uint64_t size = c->end - c->start;
			uint64_t from = pass ? ZONE_VDSO_TMP + (c->start - base) : c->start;
			uint64_t to = pass ? saved_vdso.part[i].start : ZONE_VDSO_TMP + (c->start - base);
			long r = sys5(SYS_mremap, from, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, to);

			if (r < 0)
				fatal("moving the vDSO", r);
		}
	}
}

/*
 * A System V segment: attached again where it was (its first region;
 * the others are pieces of that attachment, with their own protection),
 * and removed again if it had been (it lives while attached).
 */
static void attach_sysv(const struct ckpt_vma *v)
{
	int id = shared_sysv_id(v->shm_id);
	long r;

	if (id < 0)
		fatal("a System V segment was not recreated", -ENOENT);
	if (v->pgoff == 0) {
		r = sys3(SYS_shmat, id, v->start, (v->prot & PROT_WRITE) ? 0 : SHM_RDONLY);
		if (r < 0 || (uint64_t)r != v->start)
			fatal("attaching a System V segment", r < 0 ? r : -EFAULT);
		if (v->sysv_mode & SHM_DEST)
			sys3(SYS_shmctl, id, IPC_RMID, 0);
	}
	r = sys3(SYS_mprotect, v->start, v->end - v->start, v->prot);
	if (r < 0)
		fatal("protecting a System V segment", r);
}

/*
 * Shared anonymous memory: its pages mapped again from where they wait
 * (state/shm.c).  mremap of a shared map with old size 0 maps the same
 * pages at a new place: the same object, at the region's offset, as a
 * fork would have shared it.
 */
static void map_shared_anon(const struct ckpt_vma *v, char *waiting)
{
	uint64_t len = v->end - v->start;
	long r = sys5(SYS_mremap, waiting + v->pgoff, 0, len, MREMAP_MAYMOVE | MREMAP_FIXED,
		      v->start);

	if (r < 0 || (uint64_t)r != v->start)
		fatal("mapping shared anonymous memory", r < 0 ? r : -EFAULT);
	r = sys3(SYS_mprotect, v->start, len, v->prot);
	if (r < 0)
		fatal("protecting shared anonymous memory", r);
}

/* The reader's pieces of a region's page data. */
void memory_add_pages(const struct image *img, const struct loaded_vma *lv)
{
	const struct ckpt_vma *v = &lv->v;

	if (lv->nchunks)
		reader_add_chunks(img, lv);
	for (uint64_t i = 0, off = v->data_offset; !lv->nchunks && i < v->nruns; i++) {
		uint64_t bytes = lv->runs[i].npages * CKPT_PAGE_SIZE;

		reader_add(img, v->start + lv->runs[i].offset, bytes, off);
		off += bytes;
	}
	reader_add_refs(img, lv);
}

static void map_region(struct image *img, unsigned idx)
{
	const struct loaded_vma *lv = &img->vmas[idx];
	const struct ckpt_vma *v = &lv->v;
	uint64_t len = v->end - v->start;
	int prot = v->nruns || v->nrefs ? PROT_READ | PROT_WRITE : (int)v->prot;
	int flags = MAP_FIXED | (v->shared ? MAP_SHARED : MAP_PRIVATE);
	int fd = -1;
	long r;

	switch (v->kind) {
	case CKPT_VMA_VDSO:
		return;
	case CKPT_VMA_SYSV_SHM:
		attach_sysv(v);
		return;
	case CKPT_VMA_AIO_RING:
		aio_restore_ring(lv);
		return;
	case CKPT_VMA_FILE:
	case CKPT_VMA_SHARED_FILE:
		fd = file_fds[idx];
		break;
	case CKPT_VMA_DELETED_FILE:
		fd = file_fds[idx];
		if (fd < 0)		/* an image from before CKPT_VMA_FILE_END */
			flags |= MAP_ANONYMOUS;
		break;
	case CKPT_VMA_STACK:
		flags |= MAP_GROWSDOWN | MAP_ANONYMOUS;
		break;
	case CKPT_VMA_SHARED_ANON:
		if (shared_anon_at(v->shm_id)) {
			map_shared_anon(v, shared_anon_at(v->shm_id));
			return;
		}
		/* fall through */
	case CKPT_VMA_SHARED_MEMFILE:
		fd = shared_shm_fd(v->shm_id);
		if (fd >= 0) {		/* the object holds the pages already */
			prot = v->prot;
			break;
		}
		flags |= MAP_ANONYMOUS;
		break;
	default:
		flags |= MAP_ANONYMOUS;
		/* the kernel may drop its pages under pressure; it implies
		 * MADV_WIPEONFORK and MADV_DONTDUMP (in advice too) */
		if (v->advice & CKPT_ADVICE_DROPPABLE)
			flags = MAP_FIXED | MAP_DROPPABLE | MAP_ANONYMOUS;
		break;
	}
	r = sys6(SYS_mmap, v->start, len, prot, flags, fd, fd >= 0 ? (long)v->pgoff : 0);
	if ((v->kind == CKPT_VMA_SHARED_ANON || v->kind == CKPT_VMA_SHARED_MEMFILE) && fd >= 0) {
		if (r < 0 || (uint64_t)r != v->start)
			fatal("mapping shared memory", r < 0 ? r : -EFAULT);
		return;
	}
	if (r < 0)
		fatal("mapping a saved region", r);
	if ((uint64_t)r != v->start)
		fatal("a saved region landed elsewhere", -EFAULT);
	if (!lazy_region(lv))		/* else the page server's (lazy.c) */
		memory_add_pages(img, lv);
	if (v->nruns || v->nrefs)
		img->vmas[idx].filled = 1;	/* writable until its pages are in */
}

/* Whether map_region() hands all of the region's page data (if any) to
 * the reader, read after the point of no return, and nothing else in
 * between (image.c defers checking those blocks to the reader).  Shared
 * memory is filled before, from its object; compressed data is checked
 * by its frames. */
int region_read_by_pieces(const struct loaded_vma *lv)
{
	switch (lv->v.kind) {
	case CKPT_VMA_ANON:
	case CKPT_VMA_HEAP:
	case CKPT_VMA_STACK:
	case CKPT_VMA_FILE:
	case CKPT_VMA_DELETED_FILE:
		/* an incremental region's pages of earlier images come between */
		return !lv->nchunks && !lv->v.nrefs && !lv->v.shared;
	default:
		return 0;
	}
}

static void protect_filled(struct image *img)
{
	for (unsigned i = 0; i < img->nvmas; i++) {
		const struct ckpt_vma *v = &img->vmas[i].v;
		long r;

		if (img->vmas[i].filled &&
		    (r = sys3(SYS_mprotect, v->start, v->end - v->start, v->prot)) < 0)
			fatal("protecting a saved region", r);
	}
}

/* Guard pages again, once the pages around them are in. */
static void install_guards(struct image *img)
{
	for (unsigned i = 0; i < img->nvmas; i++) {
		const struct loaded_vma *lv = &img->vmas[i];

		for (uint64_t g = 0; g < lv->v.nguards; g++) {
			long r = sys3(SYS_madvise, lv->v.start + lv->guards[g].offset,
				      lv->guards[g].npages * CKPT_PAGE_SIZE, MADV_GUARD_INSTALL);

			if (r < 0)
				fatal("installing guard pages (MADV_GUARD_INSTALL)", r);
		}
	}
}

#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1
#endif

static const struct {
	uint32_t bit;
	int advice;
	const char *name;
} madvice[] = {
	{ CKPT_ADVICE_DONTDUMP, MADV_DONTDUMP, "MADV_DONTDUMP" },
	{ CKPT_ADVICE_DONTFORK, MADV_DONTFORK, "MADV_DONTFORK" },
	{ CKPT_ADVICE_WIPEONFORK, MADV_WIPEONFORK, "MADV_WIPEONFORK" },
	{ CKPT_ADVICE_HUGEPAGE, MADV_HUGEPAGE, "MADV_HUGEPAGE" },
	{ CKPT_ADVICE_NOHUGEPAGE, MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE" },
	{ CKPT_ADVICE_MERGEABLE, MADV_MERGEABLE, "MADV_MERGEABLE" },
	{ CKPT_ADVICE_SEQUENTIAL, MADV_SEQUENTIAL, "MADV_SEQUENTIAL" },
	{ CKPT_ADVICE_RANDOM, MADV_RANDOM, "MADV_RANDOM" },
};

/* Pair of vma_advice.c: what madvise() said, once the pages are in.  The
 * kernel here may lack what the checkpoint's had (KSM, THP): the data is
 * whole all the same, so that is a warning. */
static void advise_again(const struct ckpt_vma *v)
{
	long r;

	for (unsigned k = 0; k < sizeof(madvice) / sizeof(madvice[0]); k++)
		if ((v->advice & madvice[k].bit) &&
		    (r = sys3(SYS_madvise, v->start, v->end - v->start, madvice[k].advice)) < 0)
			warn("%llx-%llx: %s again: %s", (unsigned long long)v->start,
			     (unsigned long long)v->end, madvice[k].name, strerror(-r));
}

/* And what mlock() said: under the process's own RLIMIT_MEMLOCK, so once
 * its limits are back (process.c); a warning too.  Then mlockall(MCL_FUTURE)
 * for the regions to come, if the process had asked for it. */
void relock_memory(const struct image *img)
{
	uint32_t future = img->proc->future_locks;
	long r;

	for (unsigned i = 0; i < img->nvmas; i++) {
		const struct ckpt_vma *v = &img->vmas[i].v;

		if (!(v->advice & CKPT_ADVICE_LOCKED))
			continue;
		r = sys3(SYS_mlock2, v->start, v->end - v->start,
			 v->advice & CKPT_ADVICE_LOCKONFAULT ? MLOCK_ONFAULT : 0);
		/* PROT_NONE (a thread stack's guard) is locked, but cannot be
		 * faulted in, which mlock reports as ENOMEM */
		if (r < 0 && !(r == -ENOMEM && v->prot == 0))
			warn("%llx-%llx: cannot lock it in memory again (mlock): %s",
			     (unsigned long long)v->start, (unsigned long long)v->end,
			     strerror(-r));
	}
	if (!(future & CKPT_ADVICE_LOCKED))
		return;
	r = sys1(SYS_mlockall, MCL_FUTURE | (future & CKPT_ADVICE_LOCKONFAULT ? MCL_ONFAULT : 0));
	if (r < 0)
		warn("cannot lock the regions to come in memory again (mlockall): %s",
		     strerror(-r));
}

void restore_memory(struct image *img)
{
	unmap_old();
	move_vdso();
	for (unsigned i = 0; i < img->nvmas; i++)
		map_region(img, i);
	reader_run();
	lazy_attach(img);
	protect_filled(img);
	install_guards(img);
	for (unsigned i = 0; i < img->nvmas; i++)
		advise_again(&img->vmas[i].v);
	for (unsigned i = 0; i < img->nvmas; i++)
		if (file_fds[i] >= 0 && file_fd_owned[i])
			sys1(SYS_close, file_fds[i]);
}
