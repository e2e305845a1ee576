/**
 * @file checkpoint.h
 * @brief Checkpoints: atomic, verified, reshardable saves of a job's weights
 *        and optimizer state; sampling from a GPT.
 *
 * Layout of a checkpoint root:
 *
 *     ROOT/step-00000050/rank-00000.safetensors   rank 0's tensors
 *     ROOT/step-00000050/rank-00003.safetensors   rank 3's tensors
 *     ROOT/step-00000050/manifest.json            written last
 *     ROOT/step-00000040/...                      the previous one (keep K)
 *
 * A rank file holds, for each tensor of each model chunk the rank holds, the
 * weights under the tensor's full name ("blocks.3.attn.qkv.weight") and the
 * optimizer state under "optim.m.<name>" / "optim.v.<name>". Names do not
 * depend on the split, so a checkpoint written with one layout (pp, dp,
 * chunks, split) loads under any other for the same model.
 *
 * Atomicity: every rank writes into ROOT/step-00000050.tmp-<token>/ (fsync);
 * after a barrier rank 0 writes manifest.json (file sizes, CRC32C of every
 * file and every tensor, its own checksum), fsyncs it, renames the directory
 * to its final name and fsyncs ROOT. A checkpoint is complete iff its final
 * directory holds a manifest whose checksums match. The previous complete
 * checkpoint is not touched until the new one is complete; then only the
 * newest `keep` complete checkpoints are kept and stale .tmp directories
 * are removed.
 *
 * Ownership and threads: saving and loading read and write the models the
 * caller passes (owned by the caller; nothing else may use them during the
 * call); a bg_checkpoint_info_t owns its strings until
 * bg_checkpoint_info_clear(). With a comm, a save is collective: one call per
 * rank, from the thread that drives that rank. Calls on different roots or
 * models are independent.
 *
 * @code
 *   // given: this rank's model chunks (built for this run's layout), its place in the job
 *   bg_model_t *chunks[2]; int V = 2;
 *   bg_comm_t *comm = NULL; int dp_i = 0;           // NULL comm: one process
 *   int64_t step = 100, start = 0;
 *
 *   // every `every` steps, on every rank of the job (collective when comm != NULL):
 *   bg_checkpoint_params_t p = BG_CHECKPOINT_PARAMS_INIT;
 *   p.root = "ckpt"; p.step = step; p.models = chunks; p.nmodels = V;
 *   p.comm = comm; p.writer = (dp_i == 0); p.keep = 3;
 *   p.extra_json = "{\"layout\":{\"pp\":2,\"dp\":2}}";
 *   if (bg_checkpoint_save(&p) != BG_OK)            // the same status on every rank
 *       fprintf(stderr, "%s\n", bg_last_error());
 *
 *   // at start with --resume: build the models for this layout, then
 *   char dir[4096]; int64_t latest;
 *   if (bg_checkpoint_latest("ckpt", dir, sizeof dir, &latest) == BG_OK) {
 *       bg_checkpoint_info_t info;
 *       if (bg_checkpoint_load(dir, chunks, V, &info) == BG_OK) {  // verified; models untouched on error
 *           start = info.step;                       // the next step to run
 *           bg_checkpoint_info_clear(&info);
 *       }
 *   }   // BG_ERR_NOT_FOUND: no complete checkpoint, start from scratch
 * @endcode
 */
#ifndef BRIGADE_CHECKPOINT_H
#define BRIGADE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "brigade/model.h"
#include "brigade/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Parameters of bg_checkpoint_save(). */
typedef struct bg_checkpoint_params {
    size_t size;               /**< sizeof(bg_checkpoint_params_t), set by BG_CHECKPOINT_PARAMS_INIT */
    const char *root;          /**< checkpoint root directory (created if missing) */
    int64_t step;              /**< steps completed: the directory is step-<step>; a resumed run starts at it */
    int64_t data_position;     /**< where the data continues; -1: = step (data is a function of the step) */
    bg_model_t *const *models; /**< this rank's model chunks (weights and optimizer state are saved) */
    int nmodels;
    bg_comm_t *comm;           /**< NULL: no communication (one process, or a test calling each rank in turn,
                                    rank 0 last) */
    int rank;                  /**< with comm == NULL: this call's rank (else bg_comm_rank) */
    int world;                 /**< with comm == NULL: ranks in the job (else bg_comm_size) */
    int writer;                /**< 1: this rank writes its file; 0: it holds a copy another rank writes
                                    (data-parallel replicas other than replica 0) */
    const char *extra_json;    /**< JSON object text stored as the manifest's "extra" (layout, optimizer
                                    config, seeds...), or NULL */
    int keep;                  /**< keep the newest `keep` complete checkpoints; 0 = keep all */
    const char *token;         /**< name of the temporary directory (.tmp-<token>); NULL: chosen by rank 0
                                    (shared through the comm's store), or per process when comm == NULL */
} bg_checkpoint_params_t;

/** Defaults of bg_checkpoint_params_t: one process that writes, keeping every checkpoint. */
#define BG_CHECKPOINT_PARAMS_INIT                                                       \
    { .size = sizeof(bg_checkpoint_params_t), .root = NULL, .step = 0, .data_position = -1, \
      .models = NULL, .nmodels = 0, .comm = NULL, .rank = 0, .world = 1, .writer = 1,    \
      .extra_json = NULL, .keep = 0, .token = NULL }

/**
 * Save a checkpoint of step p->step. With a comm, collective over the whole
 * world (every rank calls it, writers and non-writers); every rank returns
 * the same status: BG_OK only once the checkpoint is complete on disk. On any
 * failure (a full disk, an unwritable root) nothing partial is visible and
 * the previous checkpoints are intact.
 */
bg_status_t bg_checkpoint_save(const bg_checkpoint_params_t *p);

/**
 * The newest complete checkpoint under @p root: its directory into
 * path_out (capacity cap) and its step. Skips .tmp directories and those
 * whose manifest is missing, corrupt (its own checksum) or whose files are
 * missing or have the wrong size (bg_checkpoint_load verifies the contents).
 * BG_ERR_NOT_FOUND when there is none (or root does not exist).
 */
bg_status_t bg_checkpoint_latest(const char *root, char *path_out, size_t cap, int64_t *step_p);

/** What a checkpoint's manifest says. */
typedef struct bg_checkpoint_info {
    int64_t step;              /**< steps completed when it was saved */
    int64_t data_position;     /**< where the data continues */
    int world;                 /**< ranks of the job that saved it */
    int files;                 /**< rank files */
    int has_optim;             /**< optimizer state saved per tensor: 0 none, 1 SGD's m, 2 AdamW's m and v */
    char *model_json;          /**< the model description (bg_model_desc_to_json); owned, see _clear */
    char *extra_json;          /**< the manifest's "extra" as JSON text ("{}" if none); owned, see _clear */
} bg_checkpoint_info_t;
/** Free what an info owns. */
void bg_checkpoint_info_clear(bg_checkpoint_info_t *info);

/** Read and check a checkpoint's manifest (its own checksum) without loading tensors. */
bg_status_t bg_checkpoint_read_info(const char *path, bg_checkpoint_info_t *info_p);

/**
 * Load the checkpoint directory @p path into @p models (any layer ranges of
 * the model that saved it): verifies the manifest, the model configuration,
 * the size and CRC32C of every file that holds a needed tensor, every needed
 * tensor's presence, dtype and shape; only then copies the weights (and the
 * optimizer state, allocating it when the checkpoint has it) by name. On any
 * error the models are untouched and the message names the file and tensor.
 * @p info_p may be NULL.
 */
bg_status_t bg_checkpoint_load(const char *path, bg_model_t *const *models, int nmodels,
                               bg_checkpoint_info_t *info_p);

/** Verify every file of a checkpoint (sizes and checksums) without loading. */
bg_status_t bg_checkpoint_verify(const char *path);

/**
 * Load weights by name from the *.safetensors files of a directory (as
 * written by `brigade train --save`, any split); no checksums (those files
 * have none). Models untouched on error.
 */
bg_status_t bg_safetensors_load_dir(const char *dir, bg_model_t *const *models, int nmodels);
/** The model description (JSON, malloc'ed) stored in the safetensors
 *  metadata of a --save directory; BG_ERR_NOT_FOUND when absent. */
bg_status_t bg_safetensors_model_json(const char *dir, char **json_p);

/* ---------------------------------------------------------------- sampling */

/**
 * Sample @p ntokens tokens after @p prompt (n >= 1 tokens) from a whole token
 * model (GPT, Llama; layers 0 .. last), one forward of the context per token (the last
 * seq_len tokens), or of the new token only with a key/value cache (bg_generate_with). temperature 0: greedy (argmax, ties to the lowest id);
 * else softmax(logits / temperature) over the top_k largest (0: all),
 * sampled with a generator seeded by @p seed (same seed, same tokens).
 * out receives ntokens tokens.
 */
bg_status_t bg_generate(bg_model_t *full_gpt, const int32_t *prompt, int n, int ntokens, float temperature,
                        int top_k, uint64_t seed, int32_t *out);

/** Options of bg_generate_with (grows by appending; size header). */
typedef struct bg_generate_params {
    size_t size;       /**< sizeof(bg_generate_params_t), set by BG_GENERATE_PARAMS_INIT */
    float temperature; /**< 0: greedy; else softmax(logits / temperature) */
    int top_k;         /**< sample among the top_k largest (0: all) */
    uint64_t seed;     /**< the sampling generator's seed */
    /** 1: a key/value cache where the model allows it (its attention leaves are all gqa_attention, as a
     *  Llama's, and it has no position table): the prompt runs once, then each token one position, while
     *  the context fits seq_len (beyond it, each token recomputes the last seq_len, as without a cache).
     *  0: every token recomputes its context. The tokens are the same either way (up to float rounding in
     *  the attention's sums: the cache's attention adds in another order). */
    int kv_cache;
} bg_generate_params_t;
/** Defaults: greedy, all tokens, seed 1, the cache on. */
#define BG_GENERATE_PARAMS_INIT                                                                              \
    { .size = sizeof(bg_generate_params_t), .temperature = 0.0f, .top_k = 0, .seed = 1, .kv_cache = 1 }
/** bg_generate with options (@p params NULL: the defaults). bg_generate is this with the cache on. */
bg_status_t bg_generate_with(bg_model_t *full, const int32_t *prompt, int n, int ntokens,
                             const bg_generate_params_t *params, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif /* BRIGADE_CHECKPOINT_H */
