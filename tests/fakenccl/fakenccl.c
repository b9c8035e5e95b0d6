/* fakenccl: the stand-in NCCL (libnccl.so.2) for CI, over the stand-in driver (tests/fakecuda).
 * Ranks are processes (or threads) that meet through a root socket a unique id names, then talk
 * over a full mesh of Unix sockets; a collective runs as a host function on the caller's stream
 * (through the driver API, so the shim's gate sees it as NCCL's kernel launches) and blocks
 * until every rank has sent its part, so a rank held before a collective strands its peers as a
 * real one does. Each communicator also shares device memory with its peers the way NCCL does
 * (cuMemCreate + export to a file descriptor + import and map), so while it lives the driver
 * checkpoint and the shim's old refusal see memory shared between processes. Like NCCL, the
 * library calls some of its own public names through the PLT (ncclBcast -> ncclBroadcast,
 * ncclCommAbort -> ncclCommGetAsyncError), so an interposer sees those calls with the library's
 * own communicators. Reductions run in rank order: results are the same whatever the timing. */
#include <cuda.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "shim_nccl_abi.h"

#define FN_EXPORT __attribute__((visibility("default")))
#define FN_MAGIC 0x666e636cu
#define FN_SHARED_BYTES ((size_t)2 << 20) /* device memory each rank shares with its peers */
#define FN_MAX_RANKS 1024
#define FN_ADDR 96
#define FN_VERSION 22809

/* The id: magic, the root's abstract socket name. */
struct fn_id {
	char magic[8];
	char addr[FN_ADDR];
	uint32_t nonce;
};
_Static_assert(sizeof(struct fn_id) <= NCCL_UNIQUE_ID_BYTES, "an id fits ncclUniqueId");

enum { MSG_DATA = 1, MSG_P2P, MSG_SPLIT, MSG_SPLITID, MSG_FD };

struct msg_hdr {
	uint32_t type;
	uint32_t from;
	uint64_t tag;
	uint64_t len;
};

struct msg {
	struct msg *next;
	uint32_t type;
	uint64_t tag;
	size_t len;
	unsigned char *data;
	int fd;
};

struct peer {
	int fd;
	int dead;
	pthread_t rx;
	int rx_on;
	struct msg *head, *tail;
	uint64_t p2p_send, p2p_recv;
	CUdeviceptr va; /* its shared memory, mapped here */
	CUmemGenericAllocationHandle h;
};

struct ncclComm {
	uint32_t magic;
	int rank, nranks, dev;
	CUcontext ctx;
	int blocking;
	_Atomic int async;
	_Atomic int aborting;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct peer *peers;
	uint64_t coll_seq, split_seq;
	int listen_fd;
	CUdeviceptr va;
	CUmemGenericAllocationHandle h;
	pthread_t init_th;
	int init_on;
	/* what an asynchronous init needs */
	struct fn_id id;
};

static __thread char last_err[200];

static void set_err(const char *what)
{
	snprintf(last_err, sizeof(last_err), "fakenccl: %s", what);
}

/* ---- sockets ---- */

static int write_all(int fd, const void *p, size_t n)
{
	const char *b = p;
	while (n > 0) {
		ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

static int read_all(int fd, void *p, size_t n)
{
	char *b = p;
	while (n > 0) {
		ssize_t r = recv(fd, b, n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

static socklen_t abstract_addr(const char *name, struct sockaddr_un *sa)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	size_t n = strnlen(name, sizeof(sa->sun_path) - 2);
	memcpy(sa->sun_path + 1, name, n);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static int listen_new(char *name)
{
	static _Atomic unsigned counter;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	snprintf(name, FN_ADDR, "fakenccl-%d-%u-%ld", (int)getpid(), atomic_fetch_add(&counter, 1) + 1,
		 (long)(ts.tv_nsec ^ ts.tv_sec));
	struct sockaddr_un sa;
	socklen_t len = abstract_addr(name, &sa);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (bind(fd, (struct sockaddr *)&sa, len) < 0 || listen(fd, FN_MAX_RANKS) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Connects, retrying while the other side is not listening yet (bounded: 10 s). */
static int connect_to(const char *name)
{
	struct sockaddr_un sa;
	socklen_t len = abstract_addr(name, &sa);
	for (int i = 0; i < 1000; i++) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -1;
		if (connect(fd, (struct sockaddr *)&sa, len) == 0)
			return fd;
		int e = errno;
		close(fd);
		if (e != ECONNREFUSED && e != ENOENT && e != EAGAIN)
			return -1;
		struct timespec ts = { 0, 10 * 1000000L };
		nanosleep(&ts, NULL);
	}
	return -1;
}

/* ---- the root: collects every rank's address, hands each the whole table ---- */

struct root {
	int lfd;
};

struct hello {
	int32_t rank, nranks;
	char addr[FN_ADDR];
};

static void *root_run(void *arg)
{
	struct root *r = arg;
	int n = 0, have = 0, *fds = NULL;
	char(*addrs)[FN_ADDR] = NULL;
	struct pollfd p = { .fd = r->lfd, .events = POLLIN };
	/* A root nobody joins goes after 10 minutes. */
	while (n == 0 || have < n) {
		if (poll(&p, 1, 600000) <= 0)
			break;
		int fd = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC);
		struct hello h;
		if (fd < 0)
			continue;
		if (read_all(fd, &h, sizeof(h)) < 0 || h.nranks < 1 || h.nranks > FN_MAX_RANKS || h.rank < 0 ||
		    h.rank >= h.nranks || (n != 0 && h.nranks != n)) {
			close(fd);
			continue;
		}
		if (n == 0) {
			n = h.nranks;
			fds = calloc((size_t)n, sizeof(*fds));
			addrs = calloc((size_t)n, sizeof(*addrs));
			if (fds == NULL || addrs == NULL)
				break;
			for (int i = 0; i < n; i++)
				fds[i] = -1;
		}
		if (fds[h.rank] >= 0) {
			close(fd);
			continue;
		}
		fds[h.rank] = fd;
		memcpy(addrs[h.rank], h.addr, FN_ADDR);
		have++;
	}
	for (int i = 0; i < n && fds != NULL; i++) {
		if (fds[i] < 0)
			continue;
		if (have == n && addrs != NULL)
			(void)write_all(fds[i], addrs, (size_t)n * FN_ADDR);
		close(fds[i]);
	}
	free(fds);
	free(addrs);
	close(r->lfd);
	free(r);
	return NULL;
}

static ncclResult_t make_id(ncclUniqueId *out)
{
	struct fn_id id = { .magic = "fakencl" };
	struct root *r = calloc(1, sizeof(*r));
	if (r == NULL)
		return ncclSystemError;
	r->lfd = listen_new(id.addr);
	if (r->lfd < 0) {
		free(r);
		return ncclSystemError;
	}
	id.nonce = (uint32_t)rand();
	pthread_t th;
	if (pthread_create(&th, NULL, root_run, r) != 0) {
		close(r->lfd);
		free(r);
		return ncclSystemError;
	}
	pthread_detach(th);
	memset(out, 0, sizeof(*out));
	memcpy(out->internal, &id, sizeof(id));
	return ncclSuccess;
}

FN_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
	return uniqueId == NULL ? ncclInvalidArgument : make_id(uniqueId);
}

FN_EXPORT ncclResult_t ncclGetVersion(int *version)
{
	if (version == NULL)
		return ncclInvalidArgument;
	*version = FN_VERSION;
	return ncclSuccess;
}

FN_EXPORT const char *ncclGetErrorString(ncclResult_t r)
{
	static const char *const names[] = { "no error", "unhandled cuda error", "unhandled system error",
					     "internal error", "invalid argument", "invalid usage", "remote process exited or there was a network error",
					     "NCCL operation in progress" };
	return (unsigned)r < sizeof(names) / sizeof(names[0]) ? names[r] : "unknown result code";
}

/* ---- a peer's receiving thread: messages queue per peer, in order ---- */

struct rx_arg {
	struct ncclComm *c;
	int j;
};

static void *rx_run(void *arg)
{
	struct rx_arg *a = arg;
	struct ncclComm *c = a->c;
	struct peer *p = &c->peers[a->j];
	free(a);
	for (;;) {
		struct msg_hdr h;
		char cbuf[CMSG_SPACE(sizeof(int))];
		struct iovec iov = { &h, sizeof(h) };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
		ssize_t got = recvmsg(p->fd, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
		int fd = -1;
		struct cmsghdr *cm = got > 0 ? CMSG_FIRSTHDR(&mh) : NULL;
		if (cm != NULL && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
			memcpy(&fd, CMSG_DATA(cm), sizeof(fd));
		if (got > 0 && (size_t)got < sizeof(h) && read_all(p->fd, (char *)&h + got, sizeof(h) - (size_t)got) < 0)
			got = -1;
		struct msg *m = got > 0 ? calloc(1, sizeof(*m)) : NULL;
		if (m != NULL && h.len > 0 && (h.len > (1ull << 34) || (m->data = malloc(h.len)) == NULL ||
					       read_all(p->fd, m->data, h.len) < 0)) {
			free(m->data);
			free(m);
			m = NULL;
		}
		pthread_mutex_lock(&c->lock);
		if (m == NULL) {
			if (fd >= 0)
				close(fd);
			p->dead = 1;
			if (!atomic_load(&c->aborting))
				atomic_store(&c->async, ncclRemoteError);
			pthread_cond_broadcast(&c->cond);
			pthread_mutex_unlock(&c->lock);
			return NULL;
		}
		m->type = h.type;
		m->tag = h.tag;
		m->len = h.len;
		m->fd = fd;
		if (p->tail != NULL)
			p->tail->next = m;
		else
			p->head = m;
		p->tail = m;
		pthread_cond_broadcast(&c->cond);
		pthread_mutex_unlock(&c->lock);
	}
}

static int send_msg(struct ncclComm *c, int j, uint32_t type, uint64_t tag, const void *data, size_t len, int fd)
{
	struct msg_hdr h = { .type = type, .from = (uint32_t)c->rank, .tag = tag, .len = len };
	struct iovec iov = { &h, sizeof(h) };
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (fd >= 0) {
		memset(cbuf, 0, sizeof(cbuf));
		mh.msg_control = cbuf;
		mh.msg_controllen = sizeof(cbuf);
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(fd));
	}
	ssize_t w;
	do
		w = sendmsg(c->peers[j].fd, &mh, MSG_NOSIGNAL);
	while (w < 0 && errno == EINTR);
	if (w < 0)
		return -1;
	if ((size_t)w < sizeof(h) && write_all(c->peers[j].fd, (char *)&h + w, sizeof(h) - (size_t)w) < 0)
		return -1;
	return len > 0 ? write_all(c->peers[j].fd, data, len) : 0;
}

/* The next message of type and tag from peer j (waits; NULL when the peer or the communicator
 * is gone). */
static struct msg *take_msg(struct ncclComm *c, int j, uint32_t type, uint64_t tag)
{
	struct peer *p = &c->peers[j];
	pthread_mutex_lock(&c->lock);
	for (;;) {
		struct msg **pp = &p->head, *prev = NULL;
		for (; *pp != NULL; prev = *pp, pp = &(*pp)->next)
			if ((*pp)->type == type && (*pp)->tag == tag)
				break;
		if (*pp != NULL) {
			struct msg *m = *pp;
			*pp = m->next;
			if (p->tail == m)
				p->tail = prev;
			pthread_mutex_unlock(&c->lock);
			return m;
		}
		if (p->dead || atomic_load(&c->aborting)) {
			pthread_mutex_unlock(&c->lock);
			return NULL;
		}
		pthread_cond_wait(&c->cond, &c->lock);
	}
}

static void free_msg(struct msg *m)
{
	if (m == NULL)
		return;
	if (m->fd >= 0)
		close(m->fd);
	free(m->data);
	free(m);
}

/* ---- device memory shared with the peers ---- */

static int share_memory(struct ncclComm *c)
{
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, c->dev } };
	CUmemAccessDesc acc = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, c->dev },
				.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	int fd = -1;
	if (cuMemCreate(&c->h, FN_SHARED_BYTES, &prop, 0) != CUDA_SUCCESS)
		return -1;
	if (cuMemAddressReserve(&c->va, FN_SHARED_BYTES, 0, 0, 0) != CUDA_SUCCESS ||
	    cuMemMap(c->va, FN_SHARED_BYTES, 0, c->h, 0) != CUDA_SUCCESS ||
	    cuMemSetAccess(c->va, FN_SHARED_BYTES, &acc, 1) != CUDA_SUCCESS ||
	    cuMemExportToShareableHandle(&fd, c->h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != CUDA_SUCCESS)
		return -1;
	int rc = 0;
	for (int j = 0; j < c->nranks && rc == 0; j++)
		if (j != c->rank)
			rc = send_msg(c, j, MSG_FD, 0, NULL, 0, fd);
	close(fd);
	for (int j = 0; j < c->nranks && rc == 0; j++) {
		if (j == c->rank)
			continue;
		struct msg *m = take_msg(c, j, MSG_FD, 0);
		struct peer *p = &c->peers[j];
		if (m == NULL || m->fd < 0 ||
		    cuMemImportFromShareableHandle(&p->h, (void *)(intptr_t)m->fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
			    CUDA_SUCCESS ||
		    cuMemAddressReserve(&p->va, FN_SHARED_BYTES, 0, 0, 0) != CUDA_SUCCESS ||
		    cuMemMap(p->va, FN_SHARED_BYTES, 0, p->h, 0) != CUDA_SUCCESS ||
		    cuMemSetAccess(p->va, FN_SHARED_BYTES, &acc, 1) != CUDA_SUCCESS)
			rc = -1;
		free_msg(m);
	}
	return rc;
}

static void unshare_memory(struct ncclComm *c)
{
	for (int j = 0; c->peers != NULL && j < c->nranks; j++) {
		struct peer *p = &c->peers[j];
		if (p->va != 0) {
			(void)cuMemUnmap(p->va, FN_SHARED_BYTES);
			(void)cuMemAddressFree(p->va, FN_SHARED_BYTES);
		}
		if (p->h != 0)
			(void)cuMemRelease(p->h);
		p->va = p->h = 0;
	}
	if (c->va != 0) {
		(void)cuMemUnmap(c->va, FN_SHARED_BYTES);
		(void)cuMemAddressFree(c->va, FN_SHARED_BYTES);
	}
	if (c->h != 0)
		(void)cuMemRelease(c->h);
	c->va = c->h = 0;
}

/* ---- communicators ---- */

static struct ncclComm *comm_new(int nranks, int rank, const struct fn_id *id, int blocking)
{
	struct ncclComm *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return NULL;
	c->magic = FN_MAGIC;
	c->rank = rank;
	c->nranks = nranks;
	c->blocking = blocking;
	c->listen_fd = -1;
	c->id = *id;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	atomic_store(&c->async, ncclInProgress);
	CUdevice d = 0;
	if (cuCtxGetCurrent(&c->ctx) != CUDA_SUCCESS || c->ctx == NULL || cuCtxGetDevice(&d) != CUDA_SUCCESS) {
		free(c);
		return NULL;
	}
	c->dev = (int)d;
	return c;
}

/* Meets the other ranks through the root, connects the mesh, shares memory. */
static ncclResult_t comm_connect(struct ncclComm *c)
{
	struct hello h = { .rank = c->rank, .nranks = c->nranks };
	char(*addrs)[FN_ADDR] = calloc((size_t)c->nranks, FN_ADDR);
	c->peers = calloc((size_t)c->nranks, sizeof(*c->peers));
	if (addrs == NULL || c->peers == NULL) {
		free(addrs);
		return ncclSystemError;
	}
	for (int j = 0; j < c->nranks; j++)
		c->peers[j].fd = -1;
	c->listen_fd = listen_new(h.addr);
	int rfd = c->listen_fd >= 0 ? connect_to(c->id.addr) : -1;
	int ok = rfd >= 0 && write_all(rfd, &h, sizeof(h)) == 0 && read_all(rfd, addrs, (size_t)c->nranks * FN_ADDR) == 0;
	if (rfd >= 0)
		close(rfd);
	/* Each rank dials the ranks above it and takes calls from those below. */
	for (int j = c->rank + 1; ok && j < c->nranks; j++) {
		int32_t me = c->rank;
		c->peers[j].fd = connect_to(addrs[j]);
		ok = c->peers[j].fd >= 0 && write_all(c->peers[j].fd, &me, sizeof(me)) == 0;
	}
	for (int k = 0; ok && k < c->rank; k++) {
		struct pollfd p = { .fd = c->listen_fd, .events = POLLIN };
		int32_t who = -1;
		int fd = poll(&p, 1, 60000) == 1 ? accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC) : -1;
		ok = fd >= 0 && read_all(fd, &who, sizeof(who)) == 0 && who >= 0 && who < c->rank &&
		     c->peers[who].fd < 0;
		if (ok)
			c->peers[who].fd = fd;
		else if (fd >= 0)
			close(fd);
	}
	free(addrs);
	if (c->listen_fd >= 0)
		close(c->listen_fd);
	c->listen_fd = -1;
	for (int j = 0; ok && j < c->nranks; j++) {
		if (j == c->rank)
			continue;
		struct rx_arg *a = malloc(sizeof(*a));
		ok = a != NULL;
		if (ok) {
			*a = (struct rx_arg){ c, j };
			ok = pthread_create(&c->peers[j].rx, NULL, rx_run, a) == 0;
			if (!ok)
				free(a);
		}
		c->peers[j].rx_on = ok;
	}
	if (!ok) {
		set_err("could not connect to every rank");
		return ncclSystemError;
	}
	if (share_memory(c) < 0) {
		set_err("could not share device memory with the peers");
		return ncclUnhandledCudaError;
	}
	return ncclSuccess;
}

static void comm_free(struct ncclComm *c)
{
	atomic_store(&c->aborting, 1);
	for (int j = 0; c->peers != NULL && j < c->nranks; j++)
		if (c->peers[j].fd >= 0)
			shutdown(c->peers[j].fd, SHUT_RDWR);
	pthread_mutex_lock(&c->lock);
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	if (c->init_on)
		pthread_join(c->init_th, NULL);
	for (int j = 0; c->peers != NULL && j < c->nranks; j++) {
		struct peer *p = &c->peers[j];
		if (p->rx_on)
			pthread_join(p->rx, NULL);
		if (p->fd >= 0)
			close(p->fd);
		while (p->head != NULL) {
			struct msg *m = p->head;
			p->head = m->next;
			free_msg(m);
		}
	}
	/* In the communicator's context: the caller's may be another device's. */
	CUcontext cur = NULL;
	(void)cuCtxGetCurrent(&cur);
	if (c->ctx != NULL)
		(void)cuCtxSetCurrent(c->ctx);
	unshare_memory(c);
	if (cur != NULL)
		(void)cuCtxSetCurrent(cur);
	free(c->peers);
	if (c->listen_fd >= 0)
		close(c->listen_fd);
	c->magic = 0;
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	free(c);
}

static void *init_run(void *arg)
{
	struct ncclComm *c = arg;
	if (c->ctx != NULL)
		(void)cuCtxSetCurrent(c->ctx);
	atomic_store(&c->async, comm_connect(c));
	return NULL;
}

/* ---- groups: the calling thread's pending work, run at its outermost ncclGroupEnd ---- */

struct coll;
struct pending {
	struct pending *next;
	struct coll *op;         /* a collective, or */
	struct ncclComm *init;   /* a communicator to connect */
	cudaStream_t stream;
};

static __thread int group_depth;
static __thread struct pending *group_head, *group_tail;

static void group_push(struct pending *p)
{
	if (group_tail != NULL)
		group_tail->next = p;
	else
		group_head = p;
	group_tail = p;
}

static int comm_ok(const struct ncclComm *c)
{
	return c != NULL && c->magic == FN_MAGIC;
}

static ncclResult_t init_rank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, const ncclConfig_t *config)
{
	struct fn_id fid;
	memcpy(&fid, id.internal, sizeof(fid));
	if (out == NULL || nranks < 1 || nranks > FN_MAX_RANKS || rank < 0 || rank >= nranks ||
	    memcmp(fid.magic, "fakencl", 7) != 0)
		return ncclInvalidArgument;
	int blocking = !(config != NULL && config->blocking == 0);
	struct ncclComm *c = comm_new(nranks, rank, &fid, blocking);
	if (c == NULL)
		return ncclUnhandledCudaError;
	*out = c;
	if (group_depth > 0) {
		struct pending *p = calloc(1, sizeof(*p));
		if (p == NULL) {
			comm_free(c);
			*out = NULL;
			return ncclSystemError;
		}
		p->init = c;
		group_push(p);
		return ncclSuccess;
	}
	if (!blocking) {
		c->init_on = pthread_create(&c->init_th, NULL, init_run, c) == 0;
		return c->init_on ? ncclInProgress : ncclSystemError;
	}
	ncclResult_t r = comm_connect(c);
	atomic_store(&c->async, r);
	if (r != ncclSuccess) {
		comm_free(c);
		*out = NULL;
	}
	return r;
}

FN_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
	return init_rank(comm, nranks, commId, rank, NULL);
}

FN_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
					      ncclConfig_t *config)
{
	return init_rank(comm, nranks, commId, rank, config);
}

FN_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
						ncclUniqueId *commIds, ncclConfig_t *config)
{
	if (nId < 1 || commIds == NULL)
		return ncclInvalidArgument;
	return init_rank(newcomm, nranks, commIds[0], myrank, config); /* the first id's root serves all */
}

struct all_arg {
	ncclComm_t *slot;
	int n, i, dev;
	ncclUniqueId id;
	ncclResult_t rc;
};

static void *init_all_run(void *arg)
{
	struct all_arg *a = arg;
	CUcontext ctx = NULL;
	CUdevice d;
	a->rc = ncclUnhandledCudaError;
	if (cuDeviceGet(&d, a->dev) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&ctx, d) == CUDA_SUCCESS &&
	    cuCtxSetCurrent(ctx) == CUDA_SUCCESS)
		a->rc = init_rank(a->slot, a->n, a->id, a->i, NULL);
	return NULL;
}

FN_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
	if (comm == NULL || ndev < 1 || ndev > 64)
		return ncclInvalidArgument;
	ncclUniqueId id;
	/* NCCL makes the id through its public name too. */
	ncclResult_t r = ncclGetUniqueId(&id);
	struct all_arg a[64];
	pthread_t th[64];
	for (int i = 0; i < ndev && r == ncclSuccess; i++) {
		a[i] = (struct all_arg){ .slot = &comm[i], .n = ndev, .i = i, .dev = devlist ? devlist[i] : i, .id = id };
		if (pthread_create(&th[i], NULL, init_all_run, &a[i]) != 0) {
			r = ncclSystemError;
			ndev = i;
		}
	}
	for (int i = 0; i < ndev; i++) {
		pthread_join(th[i], NULL);
		if (r == ncclSuccess)
			r = a[i].rc;
	}
	return r;
}

static ncclResult_t comm_abort(ncclComm_t comm)
{
	if (comm == NULL)
		return ncclSuccess;
	if (!comm_ok(comm))
		return ncclInvalidArgument;
	ncclResult_t e;
	/* As NCCL does: asks for the state through its own public name first. */
	(void)ncclCommGetAsyncError(comm, &e);
	comm_free(comm);
	return ncclSuccess;
}

FN_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	return comm_abort(comm);
}

FN_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	return comm_abort(comm);
}

FN_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
	return comm_ok(comm) ? ncclSuccess : ncclInvalidArgument;
}

FN_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
	if (!comm_ok(comm) || asyncError == NULL)
		return ncclInvalidArgument;
	*asyncError = (ncclResult_t)atomic_load(&comm->async);
	return ncclSuccess;
}

FN_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
	if (!comm_ok(comm) || count == NULL)
		return ncclInvalidArgument;
	*count = comm->nranks;
	return ncclSuccess;
}

FN_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
	if (!comm_ok(comm) || rank == NULL)
		return ncclInvalidArgument;
	*rank = comm->rank;
	return ncclSuccess;
}

FN_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
	if (!comm_ok(comm) || device == NULL)
		return ncclInvalidArgument;
	*device = comm->dev;
	return ncclSuccess;
}

FN_EXPORT const char *ncclGetLastError(ncclComm_t comm)
{
	(void)comm;
	return last_err;
}

/* ---- collectives ---- */

enum coll_kind { C_ALLREDUCE, C_BROADCAST, C_REDUCE, C_ALLGATHER, C_REDUCESCATTER, C_ALLTOALL, C_SEND, C_RECV };

struct coll {
	enum coll_kind kind;
	struct ncclComm *c;
	const void *send;
	void *recv;
	size_t count;
	ncclDataType_t dt;
	ncclRedOp_t op;
	int root, peer;
	uint64_t tag;
};

static size_t dt_size(ncclDataType_t dt)
{
	switch (dt) {
	case ncclInt8:
	case ncclUint8: return 1;
	case ncclInt32:
	case ncclUint32:
	case ncclFloat32: return 4;
	case ncclInt64:
	case ncclUint64:
	case ncclFloat64: return 8;
	default: return 0; /* half, bfloat16, fp8: not in the stand-in */
	}
}

#define REDUCE_T(T)                                                                                  \
	do {                                                                                         \
		T *d = (T *)dst;                                                                     \
		const T *s = (const T *)src;                                                         \
		for (size_t i = 0; i < n; i++)                                                       \
			d[i] = op == ncclSum || op == ncclAvg ? (T)(d[i] + s[i])                     \
			       : op == ncclProd		      ? (T)(d[i] * s[i])                     \
			       : op == ncclMax		      ? (d[i] > s[i] ? d[i] : s[i])          \
						      : (d[i] < s[i] ? d[i] : s[i]);         \
	} while (0)

static void reduce(void *dst, const void *src, size_t n, ncclDataType_t dt, ncclRedOp_t op)
{
	switch (dt) {
	case ncclInt8: REDUCE_T(int8_t); break;
	case ncclUint8: REDUCE_T(uint8_t); break;
	case ncclInt32: REDUCE_T(int32_t); break;
	case ncclUint32: REDUCE_T(uint32_t); break;
	case ncclInt64: REDUCE_T(int64_t); break;
	case ncclUint64: REDUCE_T(uint64_t); break;
	case ncclFloat32: REDUCE_T(float); break;
	case ncclFloat64: REDUCE_T(double); break;
	default: break;
	}
}

static void fail(struct ncclComm *c)
{
	if (!atomic_load(&c->aborting))
		atomic_store(&c->async, ncclRemoteError);
}

/* Every rank's part of a collective (mine from src), in rank order into parts. */
static int exchange(struct coll *o, const void *mine, size_t bytes, unsigned char **parts)
{
	struct ncclComm *c = o->c;
	for (int j = 0; j < c->nranks; j++)
		if (j != c->rank && send_msg(c, j, MSG_DATA, o->tag, mine, bytes, -1) < 0)
			return -1;
	for (int j = 0; j < c->nranks; j++) {
		if (j == c->rank) {
			parts[j] = malloc(bytes ? bytes : 1);
			if (parts[j] == NULL)
				return -1;
			memcpy(parts[j], mine, bytes);
			continue;
		}
		struct msg *m = take_msg(c, j, MSG_DATA, o->tag);
		if (m == NULL || m->len != bytes) {
			free_msg(m);
			return -1;
		}
		parts[j] = m->data;
		m->data = NULL;
		free_msg(m);
	}
	return 0;
}

static void run_coll(void *arg)
{
	struct coll *o = arg;
	struct ncclComm *c = o->c;
	size_t es = dt_size(o->dt), bytes = o->count * es;
	int n = c->nranks, rc = 0;
	unsigned char **parts = calloc((size_t)n, sizeof(*parts));
	if (parts == NULL)
		rc = -1;
	switch (rc == 0 ? o->kind : C_SEND) {
	case C_ALLREDUCE:
	case C_REDUCE:
		if (o->kind == C_REDUCE && c->rank != o->root) {
			rc = send_msg(c, o->root, MSG_DATA, o->tag, o->send, bytes, -1);
			break;
		}
		if (o->kind == C_ALLREDUCE) {
			rc = exchange(o, o->send, bytes, parts);
		} else {
			parts[c->rank] = malloc(bytes ? bytes : 1);
			rc = parts[c->rank] != NULL ? 0 : -1;
			if (rc == 0)
				memcpy(parts[c->rank], o->send, bytes);
			for (int j = 0; j < n && rc == 0; j++) {
				struct msg *m = j == c->rank ? NULL : take_msg(c, j, MSG_DATA, o->tag);
				if (j == c->rank)
					continue;
				if (m == NULL || m->len != bytes)
					rc = -1;
				else
					parts[j] = m->data, m->data = NULL;
				free_msg(m);
			}
		}
		if (rc == 0) {
			for (int j = 1; j < n; j++)
				reduce(parts[0], parts[j], o->count, o->dt, o->op);
			if (o->op == ncclAvg && (o->dt == ncclFloat32 || o->dt == ncclFloat64))
				for (size_t i = 0; i < o->count; i++) {
					if (o->dt == ncclFloat32)
						((float *)(void *)parts[0])[i] /= (float)n;
					else
						((double *)(void *)parts[0])[i] /= (double)n;
				}
			memcpy(o->recv, parts[0], bytes);
		}
		break;
	case C_BROADCAST:
		if (c->rank == o->root) {
			for (int j = 0; j < n && rc == 0; j++)
				if (j != c->rank)
					rc = send_msg(c, j, MSG_DATA, o->tag, o->send, bytes, -1);
			if (rc == 0 && o->recv != o->send)
				memmove(o->recv, o->send, bytes);
		} else {
			struct msg *m = take_msg(c, o->root, MSG_DATA, o->tag);
			if (m == NULL || m->len != bytes)
				rc = -1;
			else
				memcpy(o->recv, m->data, bytes);
			free_msg(m);
		}
		break;
	case C_ALLGATHER:
		rc = exchange(o, o->send, bytes, parts);
		for (int j = 0; j < n && rc == 0; j++)
			memcpy((char *)o->recv + (size_t)j * bytes, parts[j], bytes);
		break;
	case C_REDUCESCATTER:
		rc = exchange(o, o->send, bytes * (size_t)n, parts);
		if (rc == 0) {
			unsigned char *acc = parts[0] + (size_t)c->rank * bytes;
			for (int j = 1; j < n; j++)
				reduce(acc, parts[j] + (size_t)c->rank * bytes, o->count, o->dt, o->op);
			memcpy(o->recv, acc, bytes);
		}
		break;
	case C_ALLTOALL:
		for (int j = 0; j < n && rc == 0; j++)
			if (j != c->rank)
				rc = send_msg(c, j, MSG_DATA, o->tag, (const char *)o->send + (size_t)j * bytes, bytes, -1);
		if (rc == 0)
			memmove((char *)o->recv + (size_t)c->rank * bytes, (const char *)o->send + (size_t)c->rank * bytes, bytes);
		for (int j = 0; j < n && rc == 0; j++) {
			if (j == c->rank)
				continue;
			struct msg *m = take_msg(c, j, MSG_DATA, o->tag);
			if (m == NULL || m->len != bytes)
				rc = -1;
			else
				memcpy((char *)o->recv + (size_t)j * bytes, m->data, bytes);
			free_msg(m);
		}
		break;
	case C_SEND:
		if (parts != NULL)
			rc = send_msg(c, o->peer, MSG_P2P, o->tag, o->send, bytes, -1);
		break;
	case C_RECV: {
		struct msg *m = take_msg(c, o->peer, MSG_P2P, o->tag);
		if (m == NULL || m->len != bytes)
			rc = -1;
		else
			memcpy(o->recv, m->data, bytes);
		free_msg(m);
		break;
	}
	}
	for (int j = 0; parts != NULL && j < n; j++)
		free(parts[j]);
	free(parts);
	if (rc < 0)
		fail(c);
	/* What NCCL's kernels leave in the shared buffer: how far this rank got. */
	if (rc == 0 && c->va != 0)
		*(volatile uint64_t *)(uintptr_t)c->va = o->tag;
	free(o);
}

/* Queues (in a group) or launches one collective: the caller's stream runs it. */
static ncclResult_t submit(enum coll_kind kind, struct ncclComm *c, const void *send, void *recv, size_t count,
			   ncclDataType_t dt, ncclRedOp_t op, int root, int peer, cudaStream_t stream)
{
	if (!comm_ok(c))
		return ncclInvalidArgument;
	if (atomic_load(&c->async) == ncclInProgress)
		return ncclInvalidUsage; /* not initialised yet */
	if (dt_size(dt) == 0 || (unsigned)op >= ncclNumOps || ((kind == C_SEND || kind == C_RECV) &&
							      (peer < 0 || peer >= c->nranks || peer == c->rank)) ||
	    root < 0 || root >= c->nranks)
		return ncclInvalidArgument;
	struct coll *o = calloc(1, sizeof(*o));
	if (o == NULL)
		return ncclSystemError;
	*o = (struct coll){ .kind = kind, .c = c, .send = send, .recv = recv, .count = count, .dt = dt, .op = op,
			    .root = root, .peer = peer };
	pthread_mutex_lock(&c->lock);
	if (kind == C_SEND)
		o->tag = c->peers[peer].p2p_send++;
	else if (kind == C_RECV)
		o->tag = c->peers[peer].p2p_recv++;
	else
		o->tag = ++c->coll_seq;
	pthread_mutex_unlock(&c->lock);
	if (group_depth > 0) {
		struct pending *p = calloc(1, sizeof(*p));
		if (p == NULL) {
			free(o);
			return ncclSystemError;
		}
		p->op = o;
		p->stream = stream;
		group_push(p);
		return ncclSuccess;
	}
	if (cuLaunchHostFunc((CUstream)stream, run_coll, o) != CUDA_SUCCESS) {
		free(o);
		return ncclUnhandledCudaError;
	}
	return atomic_load(&c->async) == ncclSuccess ? ncclSuccess : ncclRemoteError;
}

FN_EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
				     ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	return submit(C_ALLREDUCE, comm, sendbuff, recvbuff, count, datatype, op, 0, -1, stream);
}

FN_EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
				  ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
	return submit(C_REDUCE, comm, sendbuff, recvbuff, count, datatype, op, root, -1, stream);
}

FN_EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
				     int root, ncclComm_t comm, cudaStream_t stream)
{
	return submit(C_BROADCAST, comm, sendbuff, recvbuff, count, datatype, ncclSum, root, -1, stream);
}

FN_EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
				 cudaStream_t stream)
{
	/* Through the public name, as NCCL does. */
	return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

FN_EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
				     ncclComm_t comm, cudaStream_t stream)
{
	return submit(C_ALLGATHER, comm, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, -1, stream);
}

FN_EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
					 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	return submit(C_REDUCESCATTER, comm, sendbuff, recvbuff, recvcount, datatype, op, 0, -1, stream);
}

FN_EXPORT ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
				    ncclComm_t comm, cudaStream_t stream)
{
	return submit(C_ALLTOALL, comm, sendbuff, recvbuff, count, datatype, ncclSum, 0, -1, stream);
}

FN_EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
				ncclComm_t comm, cudaStream_t stream)
{
	return submit(C_SEND, comm, sendbuff, NULL, count, datatype, ncclSum, 0, peer, stream);
}

FN_EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
				cudaStream_t stream)
{
	return submit(C_RECV, comm, NULL, recvbuff, count, datatype, ncclSum, 0, peer, stream);
}

FN_EXPORT ncclResult_t ncclGroupStart(void)
{
	group_depth++;
	return ncclSuccess;
}

struct init_job {
	struct ncclComm *c;
	ncclResult_t rc;
	pthread_t th;
};

static void *group_init_run(void *arg)
{
	struct init_job *j = arg;
	if (j->c->ctx != NULL)
		(void)cuCtxSetCurrent(j->c->ctx);
	j->rc = comm_connect(j->c);
	atomic_store(&j->c->async, j->rc);
	return NULL;
}

FN_EXPORT ncclResult_t ncclGroupEnd(void)
{
	if (group_depth <= 0)
		return ncclInvalidUsage;
	if (--group_depth > 0)
		return ncclSuccess;
	struct pending *p = group_head;
	group_head = group_tail = NULL;
	ncclResult_t r = ncclSuccess;
	/* The communicators a group makes meet their peers together: the ranks need not list them
	 * in the same order. */
	size_t ninit = 0;
	for (struct pending *q = p; q != NULL; q = q->next)
		ninit += q->init != NULL;
	struct init_job *jobs = ninit ? calloc(ninit, sizeof(*jobs)) : NULL;
	size_t k = 0;
	for (struct pending *q = p; q != NULL && (ninit == 0 || jobs != NULL); q = q->next)
		if (q->init != NULL) {
			jobs[k].c = q->init;
			if (pthread_create(&jobs[k].th, NULL, group_init_run, &jobs[k]) != 0)
				jobs[k].c = NULL;
			k++;
		}
	for (size_t i = 0; i < k; i++) {
		if (jobs[i].c == NULL) {
			r = ncclSystemError;
			continue;
		}
		pthread_join(jobs[i].th, NULL);
		if (jobs[i].rc != ncclSuccess)
			r = jobs[i].rc;
	}
	if (ninit > 0 && jobs == NULL)
		r = ncclSystemError;
	free(jobs);
	while (p != NULL) {
		struct pending *next = p->next;
		if (p->op != NULL) {
			if (r == ncclSuccess && cuLaunchHostFunc((CUstream)p->stream, run_coll, p->op) == CUDA_SUCCESS)
				p->op = NULL;
			else
				r = r != ncclSuccess ? r : ncclUnhandledCudaError;
			free(p->op);
		}
		free(p);
		p = next;
	}
	return r;
}

FN_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
	if (simInfo != NULL)
		simInfo->estimatedTime = 0;
	return ncclGroupEnd();
}

/* ---- split: a collective over the parent; each colour's lowest (key, rank) makes the id ---- */

struct split_part {
	int32_t color, key;
};

FN_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
	if (!comm_ok(comm) || newcomm == NULL || (color < 0 && color != NCCL_SPLIT_NOCOLOR))
		return ncclInvalidArgument;
	struct ncclComm *c = comm;
	int n = c->nranks;
	struct split_part me = { color, key }, *all = calloc((size_t)n, sizeof(*all));
	if (all == NULL)
		return ncclSystemError;
	pthread_mutex_lock(&c->lock);
	uint64_t tag = ++c->split_seq;
	pthread_mutex_unlock(&c->lock);
	int rc = 0;
	all[c->rank] = me;
	for (int j = 0; j < n && rc == 0; j++)
		if (j != c->rank)
			rc = send_msg(c, j, MSG_SPLIT, tag, &me, sizeof(me), -1);
	for (int j = 0; j < n && rc == 0; j++) {
		if (j == c->rank)
			continue;
		struct msg *m = take_msg(c, j, MSG_SPLIT, tag);
		if (m == NULL || m->len != sizeof(me))
			rc = -1;
		else
			memcpy(&all[j], m->data, sizeof(me));
		free_msg(m);
	}
	*newcomm = NULL;
	if (rc < 0 || color == NCCL_SPLIT_NOCOLOR) {
		free(all);
		return rc < 0 ? ncclRemoteError : ncclSuccess;
	}
	/* My colour's members in (key, rank) order. */
	int members[FN_MAX_RANKS], nm = 0, newrank = -1;
	for (int j = 0; j < n; j++)
		if (all[j].color == color)
			members[nm++] = j;
	for (int a = 1; a < nm; a++)
		for (int b = a; b > 0 && (all[members[b]].key < all[members[b - 1]].key ||
					  (all[members[b]].key == all[members[b - 1]].key && members[b] < members[b - 1]));
		     b--) {
			int t = members[b];
			members[b] = members[b - 1];
			members[b - 1] = t;
		}
	for (int a = 0; a < nm; a++)
		if (members[a] == c->rank)
			newrank = a;
	free(all);
	ncclUniqueId id;
	ncclResult_t r = ncclSuccess;
	if (newrank == 0) {
		r = make_id(&id);
		for (int a = 1; a < nm && r == ncclSuccess; a++)
			if (send_msg(c, members[a], MSG_SPLITID, tag, &id, sizeof(id), -1) < 0)
				r = ncclRemoteError;
	} else {
		struct msg *m = take_msg(c, members[0], MSG_SPLITID, tag);
		if (m == NULL || m->len != sizeof(id))
			r = ncclRemoteError;
		else
			memcpy(&id, m->data, sizeof(id));
		free_msg(m);
	}
	if (r != ncclSuccess)
		return r;
	ncclConfig_t cfg = { .blocking = c->blocking };
	if (config != NULL && config->blocking != NCCL_CONFIG_UNDEF_INT)
		cfg.blocking = config->blocking;
	return init_rank(newcomm, nm, id, newrank, &cfg);
}

FN_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
				      ncclConfig_t *config, int shrinkFlags)
{
	(void)excludeRanksList;
	(void)excludeRanksCount;
	(void)shrinkFlags;
	/* The stand-in's shrink keeps every rank: enough for the shim's refusal to be tested. */
	return ncclCommSplit(comm, 0, comm_ok(comm) ? comm->rank : 0, newcomm, config);
}

FN_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
	return comm_ok(comm) && revokeFlags == 0 ? ncclSuccess : ncclInvalidArgument;
}

/* ---- registrations, windows, reduction ops: handles only ---- */

FN_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
	(void)buff;
	(void)size;
	if (!comm_ok(comm) || handle == NULL)
		return ncclInvalidArgument;
	*handle = malloc(16);
	return *handle != NULL ? ncclSuccess : ncclSystemError;
}

FN_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
	if (!comm_ok(comm))
		return ncclInvalidArgument;
	free(handle);
	return ncclSuccess;
}

FN_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags)
{
	(void)buff;
	(void)size;
	(void)winFlags;
	if (!comm_ok(comm) || win == NULL)
		return ncclInvalidArgument;
	*win = malloc(16);
	return *win != NULL ? ncclSuccess : ncclSystemError;
}

FN_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
	if (!comm_ok(comm))
		return ncclInvalidArgument;
	free(win);
	return ncclSuccess;
}

FN_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
						ncclScalarResidence_t residence, ncclComm_t comm)
{
	static _Atomic int next = ncclNumOps;
	(void)scalar;
	(void)datatype;
	(void)residence;
	if (!comm_ok(comm) || op == NULL)
		return ncclInvalidArgument;
	*op = (ncclRedOp_t)atomic_fetch_add(&next, 1);
	return ncclSuccess;
}

FN_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
	(void)op;
	return comm_ok(comm) ? ncclSuccess : ncclInvalidArgument;
}

FN_EXPORT ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
	CUdeviceptr p = 0;
	if (ptr == NULL || cuMemAlloc(&p, size) != CUDA_SUCCESS)
		return ncclUnhandledCudaError;
	*ptr = (void *)(uintptr_t)p;
	return ncclSuccess;
}

FN_EXPORT ncclResult_t ncclMemFree(void *ptr)
{
	return cuMemFree((CUdeviceptr)(uintptr_t)ptr) == CUDA_SUCCESS ? ncclSuccess : ncclUnhandledCudaError;
}
