/* test_agent_quantity: Kubernetes quantities as the API server returns a pod's limits, in
 * bytes rounded up; everything else refused. */
#include "agent_quantity.h"
#include "util.h"

#include <errno.h>
#include <string.h>

static unsigned long long q(const char *s, int *rc)
{
	unsigned long long v = 12345;
	*rc = agent_quantity_parse(s, strlen(s), &v);
	return v;
}

int main(void)
{
	int rc;
	CHECK(q("0", &rc) == 0 && rc == 0);
	CHECK(q("128974848", &rc) == 128974848ULL && rc == 0);
	CHECK(q("512Mi", &rc) == 512ULL << 20 && rc == 0);
	CHECK(q("1Gi", &rc) == 1ULL << 30 && rc == 0);
	CHECK(q("1.5Gi", &rc) == 3ULL << 29 && rc == 0);
	CHECK(q("2G", &rc) == 2000000000ULL && rc == 0);
	CHECK(q("129e6", &rc) == 129000000ULL && rc == 0);
	CHECK(q("129E+6", &rc) == 129000000ULL && rc == 0);
	CHECK(q("100k", &rc) == 100000ULL && rc == 0);
	CHECK(q("+1Ki", &rc) == 1024 && rc == 0);
	CHECK(q(".5Ki", &rc) == 512 && rc == 0);
	CHECK(q("1.", &rc) == 1 && rc == 0);
	CHECK(q("0.001", &rc) == 1 && rc == 0);    /* rounded up to a whole byte */
	CHECK(q("1500m", &rc) == 2 && rc == 0);    /* 1.5 -> 2 */
	CHECK(q("1000m", &rc) == 1 && rc == 0);
	CHECK(q("12e-1", &rc) == 2 && rc == 0);
	CHECK(q("000.0000", &rc) == 0 && rc == 0);
	CHECK(q("7Ei", &rc) == 7ULL << 60 && rc == 0);
	CHECK(q("8Ei", &rc) == 12345 && rc == -ERANGE);
	CHECK(q("1e100", &rc) == 12345 && rc == -ERANGE);
	CHECK(q("-1", &rc) == 12345 && rc == -ERANGE);
	CHECK(q("-0", &rc) == 0 && rc == 0);
	CHECK(q("99999999999999999999", &rc) == 12345 && rc == -ERANGE);
	const char *bad[] = { "", "Gi", "1 Gi", "1gi", "1KiB", "1.2.3", "e3", "1e", "1e+", "0x10", "1Gi ", "--1", "." };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK(q(bad[i], &rc) == 12345 && rc == -EINVAL);
	return test_summary("test_agent_quantity");
}
