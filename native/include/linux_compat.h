/*
 * Kernel interfaces newer than the headers of the oldest system ckpt
 * builds on (Debian 12: Linux 6.1's): their numbers, for the kernels that
 * have them.  A call on an older kernel fails with EINVAL, as it should.
 */
#ifndef LINUX_COMPAT_H
#define LINUX_COMPAT_H

#ifndef PR_SET_MDWE			/* Linux 6.3 */
#define PR_SET_MDWE 65
#define PR_GET_MDWE 66
#endif

#ifndef PR_TIMER_CREATE_RESTORE_IDS	/* Linux 6.17 */
#define PR_TIMER_CREATE_RESTORE_IDS 77
#endif

#ifndef MADV_GUARD_INSTALL		/* Linux 6.13 */
#define MADV_GUARD_INSTALL 102
#endif

#ifndef MAP_DROPPABLE			/* Linux 6.11 */
#define MAP_DROPPABLE 0x08
#endif

#endif
