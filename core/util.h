/* core/util.h: helpers shared by the library and the CLI that are not public
 * API: the CLI gets them from bg_cli_util (tools/CMakeLists.txt), a static
 * library built from core/util.c, not from libbrigade.so. Must not: grow into
 * anything a host program needs (that belongs in include/brigade/). */
#ifndef BG_CORE_UTIL_H
#define BG_CORE_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Median of v[0..n) (sorts v in place; the mean of the two middle values
 * when n is even; 0 when n is 0). */
double bg_median(double *v, size_t n);

/* A positive size such as 512M, 24G, 1.5GiB, 256K or 4096 (suffixes K, M, G,
 * T of 1024, optionally followed by i and/or B): 0 and *bytes_p, or -1 for
 * anything else ("auto", "0", "12Q"), setting nothing. */
int bg_parse_bytes(const char *s, uint64_t *bytes_p);

/* FNV-1a over n bytes, continuing from h (start from BG_FNV1A_INIT): a
 * digest for lookups and for comparing settings across ranks, not a
 * checksum of data (CRC32C in models/safetensors.c is that). */
#define BG_FNV1A_INIT 1469598103934665603ULL
uint64_t bg__fnv1a_bytes(uint64_t h, const void *p, size_t n);

#endif
