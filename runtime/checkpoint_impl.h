/* runtime/checkpoint_impl.h: checkpoint internals the executor's resume
 * uses, and those the checkpoint files share (checkpoint.c: the manifest and
 * the root; checkpoint_save.c; checkpoint_load.c). runtime/ only (and the
 * fuzzers); not installed. */
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

/* ---- shared by runtime/checkpoint*.c only (defined in checkpoint.c) ---- */

#define CKPT_FORMAT "brigade-checkpoint"
#define CKPT_VERSION 1
#define CKPT_PATH_MAX 4096

/* a + sep + b into buf; the path is truncated (and later fails to open)
 * only beyond cap, which the callers' PATH_MAX-sized buffers make moot */
void bg__ckpt_pjoin(char *buf, size_t cap, const char *a, const char *sep, const char *b);
/* "step-00000050" (exactly, no suffix) -> 50; -1 if not that form */
int64_t bg__ckpt_parse_step_name(const char *name);
/* Optimizer state a model has now: 0 none, 1 SGD (m), 2 AdamW (m, v). */
int bg__ckpt_model_optim(bg_model_t *m);
/* Text of the manifest with its own checksum over the text without it
 * (NULL: out of memory); sets m's manifest_crc32c. */
char *bg__ckpt_manifest_text(json_t *m);
/* Parse and check DIR/manifest.json: *m_p is the object (caller decrefs). */
bg_status_t bg__ckpt_manifest_read(const char *dir, json_t **m_p);
/* What bg_checkpoint_read_info reports, from a checked manifest. */
bg_status_t bg__ckpt_info_from_manifest(json_t *m, const char *dir, bg_checkpoint_info_t *info);
/* Sizes of every file under dir match the manifest m. */
bg_status_t bg__ckpt_check_sizes(json_t *m, const char *dir);
/* Complete checkpoints under root (the manifest reads, its step is its
 * name's and, with check_sizes, its files have the sizes it lists), newest
 * first (*n_p of them; the caller frees *list_p). */
bg_status_t bg__ckpt_list_complete(const char *root, int check_sizes, bg__ckpt_dir_t **list_p, size_t *n_p);

#endif
