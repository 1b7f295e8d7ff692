/*
 * A pmix_value_t as text ("TYPE:HEX") and back: how the plugin keeps what
 * libpmix answered and publishes what the rank put.  The types Open MPI
 * exchanges are kept (scalars, strings, byte objects, process names);
 * other types (data arrays, pointers, topologies) are not.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pmix_plugin.h"

/* Bytes of a scalar type's member of the value's union; 0: not a scalar. */
static size_t scalar_size(pmix_data_type_t type)
{
	switch (type) {
	case PMIX_BOOL: return sizeof(bool);
	case PMIX_BYTE: case PMIX_UINT8: case PMIX_INT8: return 1;
	case PMIX_INT16: case PMIX_UINT16: return 2;
	case PMIX_INT: case PMIX_INT32: case PMIX_UINT: case PMIX_UINT32:
	case PMIX_STATUS: case PMIX_PROC_RANK: case PMIX_PID: case PMIX_FLOAT:
	case PMIX_PERSIST: case PMIX_SCOPE: case PMIX_DATA_RANGE: case PMIX_PROC_STATE:
		return 4;
	case PMIX_SIZE: case PMIX_INT64: case PMIX_UINT64: case PMIX_DOUBLE:
	case PMIX_TIME:
		return 8;
	case PMIX_TIMEVAL: return sizeof(struct timeval);
	default: return 0;
	}
}

/* n bytes as 2n lowercase hex digits and a NUL; ENOSPC where they do not fit. */
int pmix_to_hex(const void *p, size_t n, char *out, size_t size)
{
	static const char digits[] = "0123456789abcdef";
	const unsigned char *b = p;

	if (2 * n + 1 > size)
		return ENOSPC;
	for (size_t i = 0; i < n; i++) {
		*out++ = digits[b[i] >> 4];
		*out++ = digits[b[i] & 15];
	}
	*out = '\0';
	return 0;
}

static int nibble(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The bytes of hex (n of them) into out, which holds at least n. */
static int from_hex(const char *hex, size_t n, void *out)
{
	unsigned char *b = out;

	for (size_t i = 0; i < n; i++) {
		int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return EINVAL;
		b[i] = (unsigned char)(hi << 4 | lo);
	}
	return 0;
}

int pmix_value_to_text(const pmix_value_t *v, char *out, size_t size)
{
	int n = snprintf(out, size, "%u:", (unsigned)v->type);
	size_t bytes = scalar_size(v->type);

	if (n < 0 || (size_t)n >= size)
		return ENOSPC;
	out += n;
	size -= n;
	if (bytes)
		return pmix_to_hex(&v->data, bytes, out, size);
	switch (v->type) {
	case PMIX_STRING:
		return v->data.string ? pmix_to_hex(v->data.string, strlen(v->data.string), out, size)
				      : ENOTSUP;
	case PMIX_BYTE_OBJECT:
		return pmix_to_hex(v->data.bo.bytes, v->data.bo.size, out, size);
	case PMIX_PROC:
		return v->data.proc ? pmix_to_hex(v->data.proc, sizeof(*v->data.proc), out, size)
				    : ENOTSUP;
	default:
		return ENOTSUP;
	}
}

int pmix_value_from_text(const char *text, pmix_value_t *v)
{
	char *hex;
	unsigned long type = strtoul(text, &hex, 10);
	size_t n, bytes;

	if (*hex != ':' || type > UINT16_MAX)
		return EINVAL;
	hex++;
	n = strlen(hex);
	if (n % 2)
		return EINVAL;
	n /= 2;
	memset(v, 0, sizeof(*v));
	v->type = (pmix_data_type_t)type;
	bytes = scalar_size(v->type);
	if (bytes)
		return n == bytes ? from_hex(hex, n, &v->data) : EINVAL;
	switch (v->type) {
	case PMIX_STRING:
		v->data.string = calloc(1, n + 1);
		return v->data.string ? from_hex(hex, n, v->data.string) : ENOMEM;
	case PMIX_BYTE_OBJECT:
		v->data.bo.bytes = malloc(n ? n : 1);
		v->data.bo.size = n;
		return v->data.bo.bytes ? from_hex(hex, n, v->data.bo.bytes) : ENOMEM;
	case PMIX_PROC:
		if (n != sizeof(pmix_proc_t))
			return EINVAL;
		v->data.proc = calloc(1, sizeof(pmix_proc_t));
		return v->data.proc ? from_hex(hex, n, v->data.proc) : ENOMEM;
	default:
		return ENOTSUP;
	}
}
