/* test_gcr_uuid: GPU UUID text (lib/gcr_uuid): the forms NVML and nvidia-smi print, the
 * driver's 16 bytes, and what is refused (a Restore's spec.targetGPU comes from a user). */
#include "config.h"
#include "gcr_uuid.h"

#include <string.h>

#include "util.h"

int main(void)
{
	unsigned char b[16];
	CHECK(gcr_uuid_parse("GPU-5f3c1a2b-0d4e-6f70-8192-a3b4c5d6e7f8", b) == 0);
	CHECK(b[0] == 0x5f && b[1] == 0x3c && b[15] == 0xf8);
	CHECK(gcr_uuid_parse("GPU-5F3C1A2B0D4E6F708192A3B4C5D6E7F8", b) == 0 && b[0] == 0x5f && b[15] == 0xf8);
	CHECK(gcr_uuid_valid("GPU-00000000-1111-2222-3333-444444444444"));
	/* refused: no prefix, too short, too long, not hex, NULL, the stand-in's names */
	CHECK(!gcr_uuid_valid("5f3c1a2b-0d4e-6f70-8192-a3b4c5d6e7f8"));
	CHECK(!gcr_uuid_valid("GPU-5f3c1a2b-0d4e-6f70-8192-a3b4c5d6e7f"));
	CHECK(!gcr_uuid_valid("GPU-5f3c1a2b-0d4e-6f70-8192-a3b4c5d6e7f80"));
	CHECK(!gcr_uuid_valid("GPU-5f3c1a2b-0d4e-6f70-8192-a3b4c5d6e7fg"));
	CHECK(!gcr_uuid_valid(NULL) && !gcr_uuid_valid("") && !gcr_uuid_valid("GPU-"));
	CHECK(!gcr_uuid_valid("GPU-fakecuda-dev-0"));
	char longs[200];
	memset(longs, '-', sizeof(longs));
	memcpy(longs, "GPU-5f3c1a2b0d4e6f708192a3b4c5d6e7f8", 36);
	longs[sizeof(longs) - 1] = '\0';
	CHECK(gcr_uuid_parse(longs, b) == 0);  /* dashes anywhere parse */
	CHECK(!gcr_uuid_valid(longs));         /* but not longer than GCR keeps */
	return test_summary("test_gcr_uuid");
}
