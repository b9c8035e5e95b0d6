/* test_shim_nccl_poke: the pokes that wake NCCL's proxy service threads during a teardown
 * (shim/nccl/shim_nccl_poke.c). The line parsers against the kernel's formats (abstract names
 * shown with their NULs as '@', addresses as raw 32-bit words), and, with sockets made here the
 * way NCCL makes them: the UDS socket named /tmp/nccl-socket-<rank>-<hex> gets one datagram, each
 * listener made since the first communicator gets one connection (a proxy's, a bootstrap one), and
 * a listener from before (a rendezvous store), one that outlived a teardown (NCCL's RAS) and a
 * socket of another name get nothing. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "shim_nccl_poke.h"
#include "util.h"

static int parse_u(const char *line, struct shim_nccl_poke_unix *u)
{
	return shim_nccl_poke_parse_unix(line, strlen(line), u);
}

static void test_parse_unix(void)
{
	struct shim_nccl_poke_unix u;
	CHECK(parse_u("Num       RefCount Protocol Flags    Type St Inode Path\n", &u) == -EINVAL);
	CHECK(parse_u("0000000000000000: 00000002 00000000 00000000 0002 01 4242\n", &u) == 0 && u.inode == 4242 &&
	      u.type == SOCK_DGRAM && u.addr_len == 0 && !shim_nccl_poke_is_nccl_name(&u));
	/* NCCL overwrites the path's '/' with the NUL that makes the name abstract, and binds the
	 * whole sun_path: its trailing NULs are shown as '@' too. */
	CHECK(parse_u("0000000000000000: 00000002 00000000 00000000 0002 01 77 @tmp/nccl-socket-1-9f2c@@@\n", &u) == 0);
	CHECK(u.inode == 77 && shim_nccl_poke_is_nccl_name(&u));
	CHECK(u.addr_len == offsetof(struct sockaddr_un, sun_path) + 26 && u.addr.sun_path[0] == '\0' &&
	      memcmp(u.addr.sun_path + 1, "tmp/nccl-socket-1-9f2c\0\0\0", 25) == 0);
	CHECK(parse_u("0000000000000000: 00000002 00000000 00000000 0002 01 78 /tmp/nccl-socket-0-1\n", &u) == 0 &&
	      shim_nccl_poke_is_nccl_name(&u) && u.addr.sun_path[0] == '/' &&
	      u.addr_len == offsetof(struct sockaddr_un, sun_path) + 21);
	const char *not_nccl[] = { "@tmp/nccl-socket-x-1", "@tmp/nccl-socket-1-", "@tmp/nccl-socket-1-abcg",
				   "@tmp/nccl-socket-1-ABC", "@tmp/nccl-socket--1", "@tmp/other", "@",
				   "@tmp/nccl-socket-1-11111111111111111", "@/tmp/nccl-socket-1-1",
				   "tmp/nccl-socket-1-1", "@tmp/nccl-socket-1-1@x" };
	for (size_t i = 0; i < sizeof(not_nccl) / sizeof(*not_nccl); i++) {
		char line[256];
		snprintf(line, sizeof(line), "0000000000000000: 00000002 00000000 00000000 0002 01 9 %s\n", not_nccl[i]);
		CHECK(parse_u(line, &u) == 0 && !shim_nccl_poke_is_nccl_name(&u));
	}
	char big[700];
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	const char *pre = "0000000000000000: 00000002 00000000 00000000 0002 01 9 @";
	memcpy(big, pre, strlen(pre));
	CHECK(parse_u(big, &u) == -EINVAL);
	char name[200];
	snprintf(name, sizeof(name), "0000000000000000: 00000002 00000000 00000000 0002 01 9 /%0120d", 0);
	CHECK(parse_u(name, &u) == -EINVAL); /* longer than sun_path */
	CHECK(shim_nccl_poke_parse_unix("0: 1 0 0 2 1 5\0 @x", 19, &u) == -EINVAL);
}

static void test_parse_tcp(void)
{
	struct shim_nccl_poke_tcp t;
	const char *hdr = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";
	CHECK(shim_nccl_poke_parse_tcp(hdr, strlen(hdr), 0, &t) == -EINVAL);
	const char *l4 = "   3: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 5678 1 "
			 "0000000000000000 100 0 0 10 0\n";
	CHECK(shim_nccl_poke_parse_tcp(l4, strlen(l4), 0, &t) == 0 && t.state == 0x0A && t.inode == 5678);
	const struct sockaddr_in *a = (const void *)&t.local;
	CHECK(a->sin_family == AF_INET && ntohs(a->sin_port) == 8080 && ntohl(a->sin_addr.s_addr) == INADDR_LOOPBACK);
	const char *l6 = "   0: 00000000000000000000000001000000:A1B2 00000000000000000000000001000000:0050 01 "
			 "00000000:00000000 00:00000000 00000000     0        0 91 1 0000000000000000 20 4 30 10 -1\n";
	CHECK(shim_nccl_poke_parse_tcp(l6, strlen(l6), 1, &t) == 0 && t.state == 0x01 && t.inode == 91);
	const struct sockaddr_in6 *b = (const void *)&t.remote;
	CHECK(b->sin6_family == AF_INET6 && ntohs(b->sin6_port) == 80 && IN6_IS_ADDR_LOOPBACK(&b->sin6_addr));
	CHECK(shim_nccl_poke_parse_tcp(l6, strlen(l6), 0, &t) == -EINVAL); /* a v6 line read as v4 */
	const char *bad = "   3: 0100007F:1FFFF0 00000000:0000 0A 0:0 0:0 0 0 0 1\n";
	CHECK(shim_nccl_poke_parse_tcp(bad, strlen(bad), 0, &t) == -EINVAL);
}

static int listener(int *port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t l = sizeof(a);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 8) < 0 ||
	    getsockname(fd, (struct sockaddr *)&a, &l) < 0)
		return -1;
	*port = ntohs(a.sin_port);
	return fd;
}

static int connect_to(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		return -1;
	return fd;
}

/* The connection listener fd has to accept within ms, or -1. */
static int accepted(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	if (poll(&p, 1, ms) != 1)
		return -1;
	return accept(fd, NULL, NULL);
}

/* Whether listener fd has a connection to accept within ms (the poke's own, or none). */
static int accepts(int fd, int ms)
{
	int c = accepted(fd, ms);
	if (c < 0)
		return 0;
	close(c);
	return 1;
}

/* A datagram socket bound as NCCL binds its own: the path, its '/' overwritten by the NUL that
 * makes the name abstract, the whole sun_path. */
static int dgram(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	a.sun_path[0] = '\0';
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		return -1;
	return fd;
}

static void test_find_and_send(void)
{
	int p_store, p_proxy, p_boot, p_ras, p_proxy2;
	int store = listener(&p_store); /* the rendezvous store: before any communicator */
	int store_c = connect_to(p_store), store_s = accepted(store, (int)test_ms(5000));
	CHECK(store >= 0 && store_c >= 0 && store_s >= 0);
	shim_nccl_poke_before_create();
	/* A communicator's proxy (its own rank connected) and bootstrap listeners, and NCCL's RAS. */
	int proxy = listener(&p_proxy), boot = listener(&p_boot), ras = listener(&p_ras);
	int proxy_c = connect_to(p_proxy), proxy_s = accepted(proxy, (int)test_ms(5000));
	CHECK(proxy >= 0 && boot >= 0 && ras >= 0 && proxy_c >= 0 && proxy_s >= 0);
	char nccl_name[64], other_name[64];
	snprintf(nccl_name, sizeof(nccl_name), "/tmp/nccl-socket-3-%x", (unsigned)getpid());
	snprintf(other_name, sizeof(other_name), "/tmp/gcr-test-other-%x", (unsigned)getpid());
	int uds = dgram(nccl_name), other = dgram(other_name);
	CHECK(uds >= 0 && other >= 0);

	struct shim_nccl_poke pk;
	struct gcr_err err = { 0 };
	CHECK(shim_nccl_poke_find(&pk, SHIM_NCCL_POKE_OFF, &err) == 0 && pk.n_uds == 0 && pk.n_tcp == 0);
	CHECK(shim_nccl_poke_find(&pk, SHIM_NCCL_POKE_UDS, &err) == 0 && pk.n_uds == 1 && pk.n_tcp == 0);
	CHECK(shim_nccl_poke_find(&pk, SHIM_NCCL_POKE_ALL, &err) == 0 && pk.n_uds == 1 && pk.n_tcp == 3);

	shim_nccl_poke_send(&pk);
	char b[8];
	CHECK(recv(uds, b, sizeof(b), MSG_DONTWAIT) == 1);
	CHECK(recv(other, b, sizeof(b), MSG_DONTWAIT) < 0 && errno == EAGAIN);
	CHECK(accepts(proxy, (int)test_ms(5000)) && accepts(boot, (int)test_ms(5000)) &&
	      accepts(ras, (int)test_ms(5000)));
	CHECK(!accepts(store, 0));

	/* The aborts close the communicator's listeners; RAS's outlives them, and is left alone after. */
	close(proxy_c);
	close(proxy_s);
	close(proxy);
	close(boot);
	shim_nccl_poke_after_teardown();
	int proxy2 = listener(&p_proxy2); /* the rebuilt communicator's, idle: nothing connected yet */
	CHECK(proxy2 >= 0);
	CHECK(shim_nccl_poke_find(&pk, SHIM_NCCL_POKE_ALL, &err) == 0 && pk.n_uds == 1 && pk.n_tcp == 1);
	if (pk.n_tcp == 1)
		CHECK(ntohs(((struct sockaddr_in *)&pk.tcp[0])->sin_port) == p_proxy2);
	shim_nccl_poke_send(&pk);
	CHECK(accepts(proxy2, (int)test_ms(5000)));
	CHECK(!accepts(ras, 0) && !accepts(store, 0));
	/* A listener gone (its thread left and closed it): the poke is refused, quietly. */
	close(proxy2);
	shim_nccl_poke_send(&pk);
	CHECK(recv(uds, b, sizeof(b), MSG_DONTWAIT) == 1);
	close(store_c);
	close(store_s);
	close(store);
	close(ras);
	close(uds);
	close(other);
}

int main(void)
{
	test_parse_unix();
	test_parse_tcp();
	test_find_and_send();
	return test_summary("test_shim_nccl_poke");
}
