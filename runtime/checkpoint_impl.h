/* runtime/checkpoint_impl.h: the checkpoint manifest reader's internal entry
 * points, on bytes rather than a directory, for the fuzzers (fuzz/) and tests.
 * Private to the library. */
#ifndef BG_RUNTIME_CHECKPOINT_IMPL_H
#define BG_RUNTIME_CHECKPOINT_IMPL_H

#include <jansson.h>
#include <stddef.h>

#include "brigade/checkpoint.h"

/* Parse and check a manifest's text (n bytes, need not be NUL-terminated;
 * path names it in messages): JSON object, format, its own CRC32C, step,
 * model and every files[] entry. *m_p is the object (the caller decrefs). */
bg_status_t bg__manifest_parse(const char *path, const char *text, size_t n, json_t **m_p);
/* bg__manifest_parse, then what bg_checkpoint_read_info() reports from it
 * (*info_p: free with bg_checkpoint_info_clear). */
bg_status_t bg__checkpoint_info_parse(const char *path, const char *text, size_t n, bg_checkpoint_info_t *info_p);

#endif
