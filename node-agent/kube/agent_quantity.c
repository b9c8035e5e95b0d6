/* agent_quantity: Kubernetes' quantity grammar (sign, decimal number, then a binary suffix Ki..Ei,
 * a decimal one m, k, M..E, or an exponent e/E with digits), exact in integers: the number as
 * digits and a power of ten, then the suffix, rounded up to a whole unit at the end. */
#include "agent_quantity.h"

#include <errno.h>
#include <string.h>

#define LIMIT (1ULL << 63)

int agent_quantity_parse(const char *s, size_t len, unsigned long long *out)
{
	size_t i = 0;
	if (len == 0 || len > 64)
		return -EINVAL;
	int neg = 0;
	if (s[i] == '+' || s[i] == '-')
		neg = s[i++] == '-';
	/* The number: at most 19 significant digits kept (more do not fit, and are refused). */
	unsigned long long digits = 0;
	int ndigits = 0, frac = 0, seen = 0, dot = 0;
	for (; i < len && ((s[i] >= '0' && s[i] <= '9') || (s[i] == '.' && !dot)); i++) {
		if (s[i] == '.') {
			dot = 1;
			continue;
		}
		seen = 1;
		if (digits == 0 && s[i] == '0') {
			frac += dot; /* leading zeros count as places after the point */
			continue;
		}
		if (ndigits == 19)
			return -ERANGE;
		digits = digits * 10 + (unsigned long long)(s[i] - '0');
		ndigits++;
		frac += dot;
	}
	if (!seen)
		return -EINVAL;
	/* The suffix, as a multiplier and a power of ten. */
	unsigned long long mult = 1;
	int exp10 = 0;
	const char *suf = s + i;
	size_t sl = len - i;
	static const struct {
		const char *name;
		unsigned long long mult;
		int exp10;
	} sufs[] = { { "Ki", 1ULL << 10, 0 }, { "Mi", 1ULL << 20, 0 }, { "Gi", 1ULL << 30, 0 }, { "Ti", 1ULL << 40, 0 },
		     { "Pi", 1ULL << 50, 0 }, { "Ei", 1ULL << 60, 0 }, { "m", 1, -3 }, { "k", 1, 3 },
		     { "M", 1, 6 }, { "G", 1, 9 }, { "T", 1, 12 }, { "P", 1, 15 }, { "E", 1, 18 }, { "", 1, 0 } };
	int found = 0;
	for (size_t k = 0; k < sizeof(sufs) / sizeof(sufs[0]) && !found; k++)
		if (strlen(sufs[k].name) == sl && memcmp(suf, sufs[k].name, sl) == 0) {
			mult = sufs[k].mult;
			exp10 = sufs[k].exp10;
			found = 1;
		}
	if (!found) { /* an exponent: e or E, a sign, digits */
		if (sl < 2 || (suf[0] != 'e' && suf[0] != 'E'))
			return -EINVAL;
		size_t k = 1;
		int eneg = 0;
		if (suf[k] == '+' || suf[k] == '-')
			eneg = suf[k++] == '-';
		if (k == sl)
			return -EINVAL;
		int e = 0;
		for (; k < sl; k++) {
			if (suf[k] < '0' || suf[k] > '9')
				return -EINVAL;
			e = e * 10 + (suf[k] - '0');
			if (e > 100)
				return -ERANGE;
		}
		exp10 = eneg ? -e : e;
	}
	if (neg && digits != 0)
		return -ERANGE;
	/* value = digits * mult * 10^(exp10 - frac), rounded up; in 128 bits: 19 digits times 2^60
	 * fit, and any step past 2^63 is out of range (the exponent only grows it from there). */
	int p = exp10 - frac;
	unsigned __int128 v = (unsigned __int128)digits * mult;
	for (; p > 0 && v != 0; p--)
		if ((v *= 10) >= LIMIT)
			return -ERANGE;
	int up = 0;
	for (; p < 0 && v != 0; p++) {
		up |= v % 10 != 0;
		v /= 10;
	}
	v += up;
	if (v >= LIMIT)
		return -ERANGE;
	*out = (unsigned long long)v;
	return 0;
}
