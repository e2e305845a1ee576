/* models/data.c: training data. A text corpus whose bytes are the tokens,
 * token files (models/tokens.c) and a synthetic classification task for the MLP. Every sequence of a step's
 * batch is a pure function of (seed, step, sequence index), so pipeline and
 * data-parallel runs that shard the batch differently see the same data. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "brigade/model.h"
#include "core/check.h"
#include "models/tokens.h"

struct bg_data {
    int text;
    uint8_t *bytes;
    size_t len;
    int seq_len;
    int features, classes;
    float *teacher; /* (classes, features) */
    uint64_t seed;
    bg__tokens_t *tok; /* token files: sequence k = origin_seq + (step - origin_step) * batch + index */
    int batch;
    int64_t origin_step;
    uint64_t origin_seq;
};

static uint64_t mix(uint64_t a, uint64_t b, uint64_t c)
{
    bg_rng_t r;
    bg_rng_seed(&r, a ^ (b * 0x9e3779b97f4a7c15ULL) ^ (c * 0xc2b2ae3d27d4eb4fULL));
    return bg_rng_u64(&r);
}

bg_status_t bg_data_open_text(const char *path, int seq_len, uint64_t seed, bg_data_t **data_p)
{
    if (seq_len < 1)
        return bg_error(BG_ERR_INVALID, "sequence length must be >= 1 (got %d)", seq_len);
    FILE *f = fopen(path, "rb");
    if (!f)
        return bg_error(BG_ERR_IO, "cannot open data file %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return bg_error(BG_ERR_IO, "data file %s is not a regular file", path);
    }
    size_t len = (size_t)st.st_size;
    if (len == 0) {
        fclose(f);
        return bg_error(BG_ERR_INVALID, "data file %s is empty", path);
    }
    if (len < (size_t)seq_len + 2) {
        fclose(f);
        return bg_error(BG_ERR_INVALID, "data file %s has %zu bytes; sequences of %d need at least %d", path, len,
                        seq_len, seq_len + 2);
    }
    bg_data_t *d = calloc(1, sizeof(*d));
    uint8_t *bytes = malloc(len);
    if (!d || !bytes) {
        free(d);
        free(bytes);
        fclose(f);
        return bg_error(BG_ERR_NOMEM, "cannot hold data file %s (%zu bytes)", path, len);
    }
    if (fread(bytes, 1, len, f) != len) {
        free(d);
        free(bytes);
        fclose(f);
        return bg_error(BG_ERR_IO, "short read on data file %s", path);
    }
    fclose(f);
    d->text = 1;
    d->bytes = bytes;
    d->len = len;
    d->seq_len = seq_len;
    d->seed = seed;
    *data_p = d;
    return BG_OK;
}

bg_status_t bg_data_open_tokens(const char *paths, const char *format, int seq_len, int batch, int vocab,
                                uint64_t seed, bg_data_t **data_p)
{
    if (batch < 1)
        return bg_error(BG_ERR_INVALID, "token data: batch must be >= 1 (got %d)", batch);
    bg__tokens_t *tok = NULL;
    BG_CHECK(bg__tokens_open(paths, format, seq_len, vocab, seed, &tok));
    bg_data_t *d = calloc(1, sizeof(*d));
    if (!d) {
        bg__tokens_close(tok);
        return bg_error(BG_ERR_NOMEM, "token data");
    }
    d->tok = tok;
    d->batch = batch;
    d->seq_len = seq_len;
    d->seed = seed;
    *data_p = d;
    return BG_OK;
}

void bg_data_set_position(bg_data_t *d, int64_t step, uint64_t sequences)
{
    d->origin_step = step;
    d->origin_seq = sequences;
}

uint64_t bg_data_position(const bg_data_t *d, int64_t step)
{
    if (!d->tok)
        return 0;
    return d->origin_seq + (uint64_t)(step - d->origin_step) * (uint64_t)d->batch;
}

int bg_data_file_is_llmc(const char *path) { return bg__tokens_is_llmc(path); }

bg_status_t bg_data_synthetic(int features, int classes, uint64_t seed, bg_data_t **data_p)
{
    if (features < 1 || classes < 2)
        return bg_error(BG_ERR_INVALID, "synthetic data needs features >= 1 and classes >= 2 (got %d, %d)", features,
                        classes);
    bg_data_t *d = calloc(1, sizeof(*d));
    float *t = malloc((size_t)features * (size_t)classes * sizeof(float));
    if (!d || !t) {
        free(d);
        free(t);
        return bg_error(BG_ERR_NOMEM, "synthetic data");
    }
    bg_rng_t r;
    bg_rng_seed(&r, seed ^ 0x7465616368657200ULL);
    for (int i = 0; i < features * classes; i++)
        t[i] = (float)bg_rng_normal(&r);
    d->features = features;
    d->classes = classes;
    d->teacher = t;
    d->seed = seed;
    *data_p = d;
    return BG_OK;
}

bg_status_t bg_data_hold_out(bg_data_t *d, double fraction, bg_data_t **held_p)
{
    if (!d || !held_p || !(fraction > 0 && fraction < 1))
        return bg_error(BG_ERR_INVALID, "held-out fraction must be in (0, 1) (got %g)", fraction);
    if (!d->text && !d->teacher) /* a kind of data set this function does not know how to split */
        return bg_error(BG_ERR_UNSUPPORTED, "this data set cannot hold out a part of itself: give a held-out file");
    size_t held = d->text ? (size_t)((double)d->len * fraction) : 0, keep = d->len - held;
    if (d->text && (held < (size_t)d->seq_len + 2 || keep < (size_t)d->seq_len + 2))
        return bg_error(BG_ERR_INVALID, "holding out %g of a %zu-byte corpus leaves %zu bytes for training and %zu "
                        "held out; sequences of %d need at least %d in each", fraction, d->len, keep, held,
                        d->seq_len, d->seq_len + 2);
    bg_data_t *h = calloc(1, sizeof(*h));
    size_t tn = (size_t)d->features * (size_t)d->classes;
    void *buf = d->text ? malloc(held) : malloc(tn * sizeof(float));
    if (!h || !buf) {
        free(h);
        free(buf);
        return bg_error(BG_ERR_NOMEM, "cannot hold the held-out data");
    }
    *h = *d;
    if (d->text) {
        memcpy(buf, d->bytes + keep, held);
        h->bytes = buf, h->len = held;
        d->len = keep;
    } else {
        memcpy(buf, d->teacher, tn * sizeof(float));
        h->teacher = buf;
        h->seed = d->seed ^ 0x68656c646f7574ULL; /* other samples of the same task */
    }
    *held_p = h;
    return BG_OK;
}

void bg_data_close(bg_data_t *d)
{
    if (!d)
        return;
    free(d->bytes);
    free(d->teacher);
    bg__tokens_close(d->tok);
    free(d);
}

size_t bg_data_size(const bg_data_t *d) { return d->len; }
const uint8_t *bg_data_bytes(const bg_data_t *d) { return d->bytes; }

bg_status_t bg_data_batch(const bg_data_t *d, int64_t step, int first, int count, int t, int32_t *tokens,
                          float *inputs, int32_t *targets)
{
    if (d->tok) {
        if (t < 1 || t > d->seq_len)
            return bg_error(BG_ERR_INVALID, "sequence length %d is not in [1, %d] (the token windows)", t, d->seq_len);
        for (int j = 0; j < count; j++)
            bg__tokens_sequence(d->tok, bg_data_position(d, step) + (uint64_t)(first + j), t,
                                tokens ? tokens + (size_t)j * t : NULL, targets ? targets + (size_t)j * t : NULL);
        return BG_OK;
    }
    if (d->text) {
        if (t < 1 || (size_t)t + 2 > d->len)
            return bg_error(BG_ERR_INVALID, "sequence length %d does not fit the %zu-byte corpus", t, d->len);
        for (int j = 0; j < count; j++) {
            uint64_t start = mix(d->seed, (uint64_t)step, (uint64_t)(first + j)) % (d->len - (size_t)t - 1);
            for (int k = 0; k < t; k++) {
                if (tokens)
                    tokens[(size_t)j * t + k] = d->bytes[start + k];
                if (targets)
                    targets[(size_t)j * t + k] = d->bytes[start + k + 1];
            }
        }
        return BG_OK;
    }
    for (int j = 0; j < count; j++) {
        bg_rng_t r;
        bg_rng_seed(&r, mix(d->seed, (uint64_t)step, (uint64_t)(first + j)));
        float x[4096];
        int nf = d->features;
        if (nf > 4096)
            return bg_error(BG_ERR_INVALID, "synthetic data supports at most 4096 features (got %d)", nf);
        for (int k = 0; k < nf; k++)
            x[k] = (float)bg_rng_normal(&r);
        if (inputs)
            memcpy(inputs + (size_t)j * nf, x, (size_t)nf * sizeof(float));
        int best = 0;
        double bestv = -INFINITY;
        for (int c = 0; c < d->classes; c++) {
            double v = 0;
            for (int k = 0; k < nf; k++)
                v += (double)d->teacher[(size_t)c * nf + k] * x[k];
            if (v > bestv) {
                bestv = v;
                best = c;
            }
        }
        if (targets)
            targets[j] = best;
    }
    return BG_OK;
}

static bg_status_t data_source_batch(const bg_batch_request_t *rq, int32_t *tokens, float *features, int32_t *targets,
                                     void *arg)
{
    const bg_data_t *d = arg;
    if (!d->text && !d->tok && rq->in.c != d->features)
        return bg_error(BG_ERR_INVALID, "synthetic data has %d features, the model takes %d", d->features, rq->in.c);
    return bg_data_batch(d, rq->step, rq->first, rq->in.n, rq->in.t, tokens, features, targets);
}

bg_batch_source_t bg_data_source(bg_data_t *d)
{
    bg_batch_source_t s = {data_source_batch, NULL, d, 0};
    return s;
}
