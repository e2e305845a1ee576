/* runtime/checkpoint_impl.h: checkpoint internals the executor's resume
 * uses (runtime/ only; not installed). */
#ifndef BRIGADE_RUNTIME_CHECKPOINT_IMPL_H
#define BRIGADE_RUNTIME_CHECKPOINT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "brigade/checkpoint.h"

/* A directory named step-NNNNNNNN under a checkpoint root. */
typedef struct bg__ckpt_dir {
    int64_t step;
    char name[64];
} bg__ckpt_dir_t;

/* Every step-N directory under root (not .tmp ones), newest first, valid or
 * not; the caller frees *list_p. BG_ERR_NOT_FOUND when root does not exist. */
bg_status_t bg__checkpoint_dirs(const char *root, bg__ckpt_dir_t **list_p, size_t *n_p);

/* bg_checkpoint_load that also says, on failure, whether the checkpoint is
 * damaged (*damaged_p = 1: unreadable, corrupt, partial; an older one may
 * do) or incompatible (0: another format version, model or optimizer);
 * apply = 0 verifies everything the load would read and changes nothing. */
bg_status_t bg__checkpoint_load(const char *path, bg_model_t *const *models, int nmodels,
                                bg_checkpoint_info_t *info_p, int *damaged_p, int apply);

/* The manifest reader's entry points on bytes rather than a directory, for
 * the fuzzers (fuzz/) and tests. Parse and check a manifest's text (n bytes,
 * need not be NUL-terminated; path names it in messages): JSON object,
 * format, its own CRC32C, step, model and every files[] entry. *m_p is the
 * object (the caller decrefs). */

bg_status_t bg__manifest_parse(const char *path, const char *text, size_t n, json_t **m_p);
/* bg__manifest_parse, then what bg_checkpoint_read_info() reports from it
 * (*info_p: free with bg_checkpoint_info_clear). */
bg_status_t bg__checkpoint_info_parse(const char *path, const char *text, size_t n, bg_checkpoint_info_t *info_p);

#endif
