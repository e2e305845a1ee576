/* models/safetensors.h: the library's one reader and writer of safetensors
 * files (8-byte little-endian header length N, N bytes of JSON header, the
 * data section). Private: the public safetensors functions of model.h and
 * the checkpoints of runtime/checkpoint*.c are built on it; nothing else
 * parses or writes the format.
 *
 * Only F32 tensors are written, and only F32 tensors are accepted. A file is
 * validated once, when it is opened, before anything reads its data: the
 * header length lies within the file; the header is a JSON object with unique
 * keys; every tensor has dtype F32, a shape of at most BG_ST_MAX_DIMS
 * non-negative dimensions, and integer data_offsets with
 * 0 <= begin <= end <= data size and end - begin = 4 * product(shape), all in
 * checked unsigned arithmetic; no two tensors overlap; names are shorter
 * than BG_ST_NAME_MAX; __metadata__, when present, is a JSON object. Every
 * error names the file, the tensor and what was wrong (BG_ERR_PARSE). */
#ifndef BG_MODELS_SAFETENSORS_H
#define BG_MODELS_SAFETENSORS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "brigade/backend.h"
#include "brigade/layer.h"
#include "brigade/model.h"

/* Longest tensor name + 1: a model path (2 * BG_NAME_MAX) behind a
 * checkpoint's "optim.m." prefix. */
#define BG_ST_NAME_MAX (2 * BG_NAME_MAX + 16)
#define BG_ST_MAX_DIMS 8

/* CRC32C (Castagnoli) continued from crc (0 to start); the result is final.
 * The checksums of checkpoints. */
uint32_t bg__crc32c(uint32_t crc, const void *data, size_t n);

/* ---------------------------------------------------------------- writing */

/* One tensor to write. */
typedef struct bg__st_wtensor {
    const char *name;     /* unique in the file, shorter than BG_ST_NAME_MAX */
    int ndim;             /* 0 .. BG_ST_MAX_DIMS */
    const int64_t *shape; /* (ndim) */
    const float *src;     /* (product of shape) the values */
    bg_backend_t *be;     /* NULL: src is host memory; else src is on be (copied with to_host) */
    uint32_t crc32c;      /* out: CRC32C of the tensor's bytes, when the writer is asked for checksums */
} bg__st_wtensor_t;

/*
 * Write the n tensors, in this order, to path: into PATH.tmp.PID, fsync,
 * rename, fsync of the directory, so path is complete or untouched (the
 * temporary file is removed on error). metadata_json: a JSON object's text or
 * NULL; values that are not strings are stored as their JSON text (the
 * format's metadata maps strings to strings); "format": "pt" and "producer"
 * are added unless given. bytes_p (may be NULL): the file's size. crc_p (may
 * be NULL): the file's CRC32C, and each tensor's in its crc32c.
 */
bg_status_t bg__st_write(const char *path, bg__st_wtensor_t *t, int n, const char *metadata_json, uint64_t *bytes_p,
                        uint32_t *crc_p);

/* ---------------------------------------------------------------- reading */

/* A validated tensor of an open file. */
typedef struct bg__st_tensor {
    const char *name;
    int ndim;
    int64_t shape[BG_ST_MAX_DIMS];
    size_t numel;
    uint64_t begin, end; /* byte offsets in the data section */
    const void *data;    /* (numel) little-endian F32 in memory; may be unaligned: copy, don't cast */
} bg__st_tensor_t;

typedef struct bg__st_file bg__st_file_t;

/* Read the whole file at path into memory and validate it. */
bg_status_t bg__st_open(const char *path, bg__st_file_t **f_p);
/* Validate a file's image already in memory (buf, size bytes; path for the
 * messages). buf stays the caller's and must outlive the file. */
bg_status_t bg__st_parse(const char *path, const void *buf, size_t size, bg__st_file_t **f_p);
/* Every *.safetensors file of dir, opened and validated, in name order
 * (*files_p: *n_p >= 1 files; free with bg__st_close_all). None is an error
 * (BG_ERR_NOT_FOUND). */
bg_status_t bg__st_open_dir(const char *dir, bg__st_file_t ***files_p, int *n_p);
void bg__st_close(bg__st_file_t *f);
void bg__st_close_all(bg__st_file_t **files, int n);

const char *bg__st_path(const bg__st_file_t *f);
/* Tensors in name order: i in 0 .. bg__st_count - 1. */
int bg__st_count(const bg__st_file_t *f);
const bg__st_tensor_t *bg__st_tensor(const bg__st_file_t *f, int i);
/* The tensor called name; NULL when the file has none. */
const bg__st_tensor_t *bg__st_find(const bg__st_file_t *f, const char *name);
/* __metadata__ (borrowed, valid while f is open); NULL when absent. */
json_t *bg__st_metadata(const bg__st_file_t *f);

/* BG_ERR_MISMATCH naming the file and tensor unless t has this shape. */
bg_status_t bg__st_check_shape(const bg__st_file_t *f, const bg__st_tensor_t *t, int ndim, const int64_t *shape);
/* Copy t's values into dst: host memory when be is NULL, else on be. */
void bg__st_copy(const bg__st_tensor_t *t, bg_backend_t *be, float *dst);
/* The file holds tensor t whole for parameter p (its full shape when p is a
 * tensor-parallel shard): BG_ERR_MISMATCH naming both shapes otherwise. */
bg_status_t bg__st_check_param(const bg__st_file_t *f, const bg__st_tensor_t *t, const bg_param_t *p);
/* Copy member `part`'s shard of t (all of t for a whole tensor) to dst
 * (p->numel floats on be, or host memory when be is NULL). */
bg_status_t bg__st_copy_param(const bg__st_tensor_t *t, const bg_param_t *p, int part, bg_backend_t *be, float *dst);
/* The part of its group (bg_model_desc_group_of: tensor- or expert-parallel) a shard p of model m holds (0: whole). */
int bg__st_part(bg_model_t *m, const bg_param_t *p);

#endif
