/* gcr_uuid: GPU UUIDs as NVML and nvidia-smi -L print them ("GPU-" and 32 hex digits, dashes
 * anywhere), read into the 16 bytes the driver's checkpoint API takes. No GPU library needed, so
 * parsers of outside input (a Restore's spec) check them too. */
#ifndef GCR_UUID_H
#define GCR_UUID_H

/* The longest UUID text GCR keeps, with the NUL. */
#define GCR_UUID_TEXT_LEN 96

/* 0 with out filled, or -1 when s is not a GPU UUID. */
int gcr_uuid_parse(const char *s, unsigned char out[16]);

/* Whether s is a GPU UUID shorter than GCR_UUID_TEXT_LEN. */
int gcr_uuid_valid(const char *s);

#endif
