/**
 * @file train.h
 * @brief Training: the loop around stages, data, the optimizer, metrics and saving.
 *
 * `batch` is the global batch (sequences per optimizer step), split into
 * `microbatches` equal microbatches whose gradients accumulate in microbatch
 * order before one optimizer step. The loss is the mean over the batch's
 * tokens (positions), so gradients do not depend on how the batch is split.
 */
#ifndef BRIGADE_TRAIN_H
#define BRIGADE_TRAIN_H

#include "brigade/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Called after every step (the CLI prints progress from it). */
typedef struct bg_step_info {
    int step;            /**< 1-based */
    int steps;           /**< total */
    double loss;         /**< mean loss of the step's batch */
    double step_ms;      /**< wall time of the step */
    double tokens_per_s; /**< batch tokens / step time */
} bg_step_info_t;
typedef void (*bg_step_fn)(const bg_step_info_t *info, void *arg);

typedef struct bg_train_config {
    size_t size;                 /**< sizeof(bg_train_config_t) */
    bg_model_config_t model;
    bg_optim_config_t optim;
    int batch;                   /**< global batch, sequences */
    int microbatches;            /**< per step; divides batch */
    int seq;                     /**< GPT: training sequence length (<= model.seq_len); 0 = model.seq_len */
    int steps;
    const char *data_path;       /**< GPT: text corpus */
    uint64_t data_seed;          /**< order of the data */
    const char *metrics_path;    /**< JSON lines, one per step; NULL = none */
    const char *save_dir;        /**< final weights as DIR/model.safetensors; NULL = none */
    const char *backend;         /**< "cpu" (default), "cuda" */
    int threads;                 /**< compute threads; 0 = default */
    bg_step_fn on_step;
    void *on_step_arg;
} bg_train_config_t;

/** Defaults: GPT as BG_MODEL_CONFIG_INIT, AdamW lr 1e-3, batch 8, 4 microbatches, 20 steps. */
void bg_train_config_init(bg_train_config_t *cfg);

typedef struct bg_train_result {
    double final_loss;        /**< loss of the last step */
    double first_loss;        /**< loss of the first step */
    double median_step_ms;
    double tokens_per_s;      /**< median */
    double flops_per_step;    /**< model FLOPs (forward + backward) per step, from the layers */
    size_t params;
    size_t peak_bytes;        /**< the allocator's peak */
    size_t predicted_bytes;   /**< params + grads + optimizer + activations as layers report them */
} bg_train_result_t;

/** Check the configuration (messages name the flag-level field) without running. */
bg_status_t bg_train_check(const bg_train_config_t *cfg);
/** Run single-process training. */
bg_status_t bg_train(const bg_train_config_t *cfg, bg_train_result_t *result_p);

/** Check that a directory exists or can be created and is writable (before a run). */
bg_status_t bg_check_writable_dir(const char *dir);

#ifdef __cplusplus
}
#endif
#endif
