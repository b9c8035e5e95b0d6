/* fuzz_ncclpoke: the shim's parsers of /proc/net/unix and /proc/net/tcp{,6} lines (what names
 * other processes of the pod bind is in them); a success always yields an address within its
 * structure, and a name taken for NCCL's has NCCL's form. */
#include "shim_nccl_poke.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct shim_nccl_poke_unix u;
	if (shim_nccl_poke_parse_unix((const char *)data, size, &u) == 0) {
		if (u.addr_len > sizeof(u.addr) || (u.addr_len != 0 && u.addr.sun_family != AF_UNIX))
			abort();
		if (shim_nccl_poke_is_nccl_name(&u)) {
			const char *s = u.addr.sun_path;
			if (s[0] == '\0' ? strncmp(s + 1, "tmp/nccl-socket-", 16) != 0 : strncmp(s, "/tmp/nccl-socket-", 17) != 0)
				abort();
		}
	}
	for (int v6 = 0; v6 < 2; v6++) {
		struct shim_nccl_poke_tcp t;
		if (shim_nccl_poke_parse_tcp((const char *)data, size, v6, &t) == 0 &&
		    (t.state > 0xff || t.local.ss_family != (v6 ? AF_INET6 : AF_INET) ||
		     t.remote.ss_family != t.local.ss_family))
			abort();
	}
	return 0;
}
