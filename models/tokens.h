/* models/tokens.h: token files (llm.c's format, raw uint16 / uint32 arrays),
 * one or many shards, memory-mapped, sampled as shuffled windows. Private to
 * models/: data.c wraps it as a bg_data_t. It must not read the environment
 * or know about ranks: a sequence is a pure function of (seed, its global
 * index). */
#ifndef BG_MODELS_TOKENS_H
#define BG_MODELS_TOKENS_H

#include <stdint.h>

#include "brigade/status.h"

typedef struct bg__tokens bg__tokens_t;

/* Open the shards named by @p paths (a comma-separated list; each item a
 * file or a glob pattern, matches in name order) in @p format (raw16,
 * raw32, llmc, auto; NULL: auto), windows of seq_len + 1 tokens, every
 * token checked < vocab. */
bg_status_t bg__tokens_open(const char *paths, const char *format, int seq_len, int vocab, uint64_t seed,
                            bg__tokens_t **tok_p);
void bg__tokens_close(bg__tokens_t *tok);
/* Sequence number @p k (k = step * batch + index in the step's batch):
 * t tokens and their targets (the next tokens) of window perm_e(k mod W) of
 * epoch e = k / W, t <= seq_len. */
void bg__tokens_sequence(const bg__tokens_t *tok, uint64_t k, int t, int32_t *tokens, int32_t *targets);
/* Windows per epoch, and tokens in all shards. */
uint64_t bg__tokens_windows(const bg__tokens_t *tok);
uint64_t bg__tokens_count(const bg__tokens_t *tok);
/* Whether the file at @p path starts with an llm.c magic (auto detection). */
int bg__tokens_is_llmc(const char *path);

#endif
