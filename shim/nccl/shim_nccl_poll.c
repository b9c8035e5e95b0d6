/* shim_nccl_poll: NCCL's own waits in poll() end when a group member tears its communicators
 * down.
 *
 * Why: NCCL's proxy service threads wait in poll() with a 500 ms timeout and look at their stop
 * flag only when it returns (src/proxy.cc: "never let proxy service thread blocks in poll"); the
 * UDS one gets no message that would wake it, so each ncclCommDestroy joined it up to 500 ms
 * later (a member's teardown took 0.03-0.96 s on H200, run 59: most of a group suspend's spread).
 * So a poll() called from the NCCL library's own code also waits on a descriptor of ours:
 * shim_nccl_poll_hurry(1) makes it readable, every such wait returns 0 (a timeout, which NCCL
 * handles by reading its flags), and until shim_nccl_poll_hurry(0) NCCL's polls wait at most
 * SHIM_NCCL_POLL_HURRY_MS. Polls from any other code reach libc's unchanged: the test is two
 * compares of the return address against the NCCL library's text, known from its loading. */
#include "shim_nccl_poll.h"

#include <errno.h>
#include <link.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "gcr_log.h"
#include "shim_hooktab.h"

extern int __poll(struct pollfd *fds, nfds_t nfds, int timeout); /* glibc's own, exported */

/* NCCL's polls watch at most this many descriptors here (its service thread: its connections + 1). */
#define POLL_MAX 4096

static _Atomic(uintptr_t) text_lo, text_hi; /* the NCCL library's loaded range, 0 until known */
static atomic_int wake_fd = -1;
static atomic_int hurry;

struct find {
	uintptr_t addr, lo, hi;
};

static int find_range(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	struct find *f = data;
	uintptr_t lo = UINTPTR_MAX, hi = 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_LOAD)
			continue;
		uintptr_t a = info->dlpi_addr + ph->p_vaddr;
		lo = a < lo ? a : lo;
		hi = a + ph->p_memsz > hi ? a + ph->p_memsz : hi;
	}
	if (f->addr < lo || f->addr >= hi)
		return 0;
	f->lo = lo;
	f->hi = hi;
	return 1;
}

void shim_nccl_poll_setup(const void *fn)
{
	if (fn == NULL || atomic_load(&text_lo) != 0)
		return;
	struct find f = { .addr = (uintptr_t)fn };
	if (dl_iterate_phdr(find_range, &f) == 0)
		return;
	int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (fd < 0) {
		GCR_LOG(GCR_LOG_WARN, "shim", "no eventfd for NCCL's polls (%s): a teardown waits for them", strerror(errno));
		return;
	}
	atomic_store(&wake_fd, fd);
	atomic_store(&text_hi, f.hi);
	atomic_store(&text_lo, f.lo); /* last: the poll wrapper tests lo first */
}

int shim_nccl_poll_is_nccl(const void *caller)
{
	uintptr_t lo = atomic_load_explicit(&text_lo, memory_order_acquire), a = (uintptr_t)caller;
	return lo != 0 && a >= lo && a < atomic_load_explicit(&text_hi, memory_order_relaxed);
}

void shim_nccl_poll_hurry(int on)
{
	int fd = atomic_load(&wake_fd);
	uint64_t one = 1;
	if (on) {
		atomic_fetch_add(&hurry, 1);
		if (fd >= 0 && write(fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
			GCR_LOG(GCR_LOG_WARN, "shim", "waking NCCL's polls: %s", strerror(errno));
		return;
	}
	if (atomic_fetch_sub(&hurry, 1) == 1 && fd >= 0)
		(void)!read(fd, &one, sizeof(one)); /* drained: NCCL's polls wait as they ask again */
}

/* A poll from NCCL: its descriptors and ours, or (while hurried) its own with a short timeout. */
static int nccl_poll(struct pollfd *fds, nfds_t nfds, int timeout, int wfd)
{
	if (atomic_load(&hurry) > 0)
		return __poll(fds, nfds, timeout >= 0 && timeout < SHIM_NCCL_POLL_HURRY_MS ? timeout
											 : SHIM_NCCL_POLL_HURRY_MS);
	struct pollfd local[16], *all = nfds + 1 <= 16 ? local : malloc((nfds + 1) * sizeof(*all));
	if (all == NULL)
		return __poll(fds, nfds, timeout);
	if (nfds > 0)
		memcpy(all, fds, nfds * sizeof(*all));
	all[nfds] = (struct pollfd){ .fd = wfd, .events = POLLIN };
	int rc = __poll(all, nfds + 1, timeout);
	if (rc > 0) {
		for (nfds_t i = 0; i < nfds; i++)
			fds[i].revents = all[i].revents;
		if (all[nfds].revents != 0)
			rc--; /* ours: to NCCL, a timeout (or just its own that are ready) */
	}
	if (all != local)
		free(all);
	return rc;
}

SHIM_EXPORT int poll(struct pollfd *fds, nfds_t nfds, int timeout)
{
	const void *caller = __builtin_return_address(0);
	int wfd = atomic_load_explicit(&wake_fd, memory_order_relaxed);
	if (wfd < 0 || nfds >= POLL_MAX || !shim_nccl_poll_is_nccl(caller))
		return __poll(fds, nfds, timeout);
	return nccl_poll(fds, nfds, timeout, wfd);
}
