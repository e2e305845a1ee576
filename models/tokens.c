/* models/tokens.c: token files as training data (models/tokens.h): llm.c's
 * shards (a 256 x int32 header: magic 20240520 version 1 with uint16 tokens,
 * or magic 20240801 version 7 with uint32 tokens; then the tokens), and
 * headerless uint16 / uint32 arrays (nanoGPT's train.bin). Each shard is
 * memory-mapped read-only and cut into non-overlapping windows of
 * seq_len + 1 tokens; epoch e visits every window once in an order keyed by
 * (seed, e), a bijection computed on the spot (a Feistel network walked
 * until it lands inside), so the data position is the sequence count alone
 * and a resumed run sees the batches of the uninterrupted one. It must not
 * copy the shards into memory or keep a position of its own. */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "brigade/core.h"
#include "core/check.h"
#include "models/tokens.h"

enum { LLMC_HEADER_INTS = 256, LLMC_MAGIC16 = 20240520, LLMC_MAGIC32 = 20240801 };

typedef struct shard {
    char *path;
    void *map;       /* the whole file */
    size_t map_len;
    size_t skip;     /* header bytes */
    int width;       /* bytes per token: 2 or 4 */
    uint64_t ntok;
    uint64_t first_window; /* windows before this shard */
} shard_t;

struct bg__tokens {
    shard_t *shards;
    int nshards;
    int seq_len;
    uint64_t windows, count;
    uint64_t seed;
};

static uint32_t token_at(const shard_t *s, uint64_t i)
{
    const uint8_t *p = (const uint8_t *)s->map + s->skip + i * (uint64_t)s->width;
    if (s->width == 2)
        return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int bg__tokens_is_llmc(const char *path)
{
    int32_t magic = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t n = fread(&magic, sizeof magic, 1, f);
    fclose(f);
    return n == 1 && (magic == LLMC_MAGIC16 || magic == LLMC_MAGIC32);
}

/* The shard's layout from its format and, for llm.c files, its header. */
static bg_status_t shard_layout(shard_t *s, const char *format)
{
    const char *p = s->path;
    if (s->map_len == 0)
        return bg_error(BG_ERR_INVALID, "token file %s is empty", p);
    if (strcmp(format, "llmc") == 0) {
        if (s->map_len < LLMC_HEADER_INTS * 4)
            return bg_error(BG_ERR_INVALID, "token file %s: %zu bytes, shorter than llm.c's header (%d bytes): "
                            "truncated", p, s->map_len, LLMC_HEADER_INTS * 4);
        int32_t h[3];
        memcpy(h, s->map, sizeof h);
        if (h[0] == LLMC_MAGIC16 && h[1] == 1)
            s->width = 2;
        else if (h[0] == LLMC_MAGIC32 && h[1] == 7)
            s->width = 4;
        else if (h[0] == LLMC_MAGIC16 || h[0] == LLMC_MAGIC32)
            return bg_error(BG_ERR_INVALID, "token file %s: llm.c version %d at offset 4 is not one brigade reads "
                            "(magic %d: version %d)", p, h[1], h[0], h[0] == LLMC_MAGIC16 ? 1 : 7);
        else
            return bg_error(BG_ERR_INVALID, "token file %s: magic %d at offset 0, expected llm.c's 20240520 "
                            "(uint16 tokens) or 20240801 (uint32); --data-format raw16|raw32 reads headerless "
                            "arrays", p, h[0]);
        s->skip = LLMC_HEADER_INTS * 4;
        uint64_t body = s->map_len - s->skip;
        if (h[2] < 0 || body != (uint64_t)h[2] * (uint64_t)s->width)
            return bg_error(BG_ERR_INVALID, "token file %s: the header (offset 8) says %d tokens, i.e. %llu bytes "
                            "after it, but the file has %llu: truncated or damaged", p, h[2],
                            (unsigned long long)((uint64_t)(h[2] < 0 ? 0 : h[2]) * (uint64_t)s->width),
                            (unsigned long long)body);
    } else {
        s->width = strcmp(format, "raw32") == 0 ? 4 : 2;
        if (s->map_len % (size_t)s->width)
            return bg_error(BG_ERR_INVALID, "token file %s: %zu bytes is not a whole number of %d-byte tokens "
                            "(--data-format %s)", p, s->map_len, s->width, format);
    }
    s->ntok = (s->map_len - s->skip) / (size_t)s->width;
    return BG_OK;
}

/* Map one shard and check it (layout, every token < vocab). */
static bg_status_t shard_open(shard_t *s, const char *format_in, int vocab)
{
    const char *format = format_in;
    if (strcmp(format, "auto") == 0) { /* llm.c by its magic, else nanoGPT's uint16 arrays */
        if (access(s->path, R_OK) != 0)
            return bg_error(BG_ERR_IO, "cannot open token file %s: %s", s->path, strerror(errno));
        format = bg__tokens_is_llmc(s->path) ? "llmc" : "raw16";
    }
    int fd = open(s->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return bg_error(BG_ERR_IO, "cannot open token file %s: %s", s->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return bg_error(BG_ERR_IO, "token file %s is not a regular file", s->path);
    }
    s->map_len = (size_t)st.st_size;
    if (s->map_len) {
        s->map = mmap(NULL, s->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (s->map == MAP_FAILED) {
            s->map = NULL;
            close(fd);
            return bg_error(BG_ERR_IO, "cannot map token file %s: %s", s->path, strerror(errno));
        }
    }
    close(fd);
    BG_CHECK(shard_layout(s, format));
    for (uint64_t i = 0; i < s->ntok; i++) {
        uint32_t t = token_at(s, i);
        if (t >= (uint32_t)vocab)
            return bg_error(BG_ERR_INVALID, "token file %s: token %u at byte offset %llu (token %llu) is >= --vocab "
                            "%d", s->path, t, (unsigned long long)(s->skip + i * (uint64_t)s->width),
                            (unsigned long long)i, vocab);
    }
    return BG_OK;
}

/* The comma list's items, each a file or a glob pattern, into paths (owned strings). */
static bg_status_t expand(const char *list, char ***paths_p, int *n_p)
{
    char *copy = strdup(list), *save = NULL;
    char **paths = NULL;
    int n = 0;
    bg_status_t st = copy ? BG_OK : bg_error(BG_ERR_NOMEM, "token file list");
    for (char *item = copy ? strtok_r(copy, ",", &save) : NULL; st == BG_OK && item;
         item = strtok_r(NULL, ",", &save)) {
        glob_t g;
        int globbed = strpbrk(item, "*?[") != NULL;
        if (globbed && glob(item, 0, NULL, &g) != 0) {
            st = bg_error(BG_ERR_NOT_FOUND, "no token file matches %s", item);
            break;
        }
        size_t k = globbed ? g.gl_pathc : 1;
        char **grown = realloc(paths, (size_t)(n + (int)k) * sizeof(char *));
        if (!grown)
            st = bg_error(BG_ERR_NOMEM, "token file list");
        else
            paths = grown;
        for (size_t i = 0; st == BG_OK && i < k; i++)
            if (!(paths[n++] = strdup(globbed ? g.gl_pathv[i] : item)))
                st = bg_error(BG_ERR_NOMEM, "token file list");
        if (globbed)
            globfree(&g);
    }
    free(copy);
    if (st == BG_OK && n == 0)
        st = bg_error(BG_ERR_INVALID, "no token file named in \"%s\"", list);
    *paths_p = paths;
    *n_p = n;
    return st;
}

void bg__tokens_close(bg__tokens_t *tok)
{
    if (!tok)
        return;
    for (int i = 0; i < tok->nshards; i++) {
        if (tok->shards[i].map)
            munmap(tok->shards[i].map, tok->shards[i].map_len);
        free(tok->shards[i].path);
    }
    free(tok->shards);
    free(tok);
}

bg_status_t bg__tokens_open(const char *list, const char *format, int seq_len, int vocab, uint64_t seed,
                            bg__tokens_t **tok_p)
{
    if (!format)
        format = "auto";
    if (strcmp(format, "auto") && strcmp(format, "llmc") && strcmp(format, "raw16") && strcmp(format, "raw32"))
        return bg_error(BG_ERR_INVALID, "--data-format %s: expected raw16, raw32, llmc or auto", format);
    if (seq_len < 1 || vocab < 2)
        return bg_error(BG_ERR_INVALID, "token data: sequence length %d and vocab %d", seq_len, vocab);
    bg__tokens_t *tok = calloc(1, sizeof(*tok));
    BG_ALLOC_CHECK(tok, sizeof(*tok), "token data");
    tok->seq_len = seq_len;
    tok->seed = seed;
    char **paths = NULL;
    int n = 0;
    bg_status_t st = expand(list ? list : "", &paths, &n);
    tok->shards = st == BG_OK ? calloc((size_t)n, sizeof(shard_t)) : NULL;
    if (st == BG_OK && !tok->shards)
        st = bg_error(BG_ERR_NOMEM, "token shards");
    for (int i = 0; i < n; i++) {
        if (tok->shards) {
            tok->shards[i].path = paths[i];
            tok->nshards = i + 1;
        } else {
            free(paths[i]);
        }
    }
    free(paths);
    for (int i = 0; st == BG_OK && i < tok->nshards; i++) {
        shard_t *s = &tok->shards[i];
        st = shard_open(s, format, vocab);
        s->first_window = tok->windows;
        tok->windows += s->ntok > 0 ? (s->ntok - 1) / (uint64_t)seq_len : 0;
        tok->count += s->ntok;
    }
    if (st == BG_OK && tok->windows == 0)
        st = bg_error(BG_ERR_INVALID, "token data %s: %llu tokens in %d file%s, not one window of %d + 1", list,
                      (unsigned long long)tok->count, tok->nshards, tok->nshards == 1 ? "" : "s", seq_len);
    if (st != BG_OK) {
        bg__tokens_close(tok);
        return st;
    }
    *tok_p = tok;
    return BG_OK;
}

uint64_t bg__tokens_windows(const bg__tokens_t *tok) { return tok->windows; }
uint64_t bg__tokens_count(const bg__tokens_t *tok) { return tok->count; }

static uint64_t hash3(uint64_t a, uint64_t b, uint64_t c)
{
    bg_rng_t r;
    bg_rng_seed(&r, a ^ (b * 0x9e3779b97f4a7c15ULL) ^ (c * 0xc2b2ae3d27d4eb4fULL));
    return bg_rng_u64(&r);
}

/* A bijection of [0, n) keyed by (seed, epoch): a four-round Feistel network
 * on the smallest even number of bits that holds n, applied again while the
 * value falls outside [0, n) (cycle walking; it ends since the network is a
 * permutation of a set that contains [0, n)). */
static uint64_t permute(uint64_t i, uint64_t n, uint64_t seed, uint64_t epoch)
{
    int bits = 2;
    while (bits < 64 && (1ULL << bits) < n)
        bits += 2;
    int h = bits / 2;
    uint64_t mask = (1ULL << h) - 1;
    uint64_t key = hash3(seed, epoch, 0x5348554646ULL);
    do {
        uint64_t l = i >> h, r = i & mask;
        for (int round = 0; round < 4; round++) {
            uint64_t f = hash3(key, (uint64_t)round, r) & mask;
            uint64_t t = l ^ f;
            l = r;
            r = t;
        }
        i = l << h | r;
    } while (i >= n);
    return i;
}

void bg__tokens_sequence(const bg__tokens_t *tok, uint64_t k, int t, int32_t *tokens, int32_t *targets)
{
    uint64_t w = permute(k % tok->windows, tok->windows, tok->seed, k / tok->windows);
    int lo = 0, hi = tok->nshards - 1; /* the shard holding window w: the last whose first_window <= w */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (tok->shards[mid].first_window <= w)
            lo = mid;
        else
            hi = mid - 1;
    }
    const shard_t *s = &tok->shards[lo];
    uint64_t at = (w - s->first_window) * (uint64_t)tok->seq_len;
    for (int j = 0; j < t; j++) {
        if (tokens)
            tokens[j] = (int32_t)token_at(s, at + (uint64_t)j);
        if (targets)
            targets[j] = (int32_t)token_at(s, at + (uint64_t)j + 1);
    }
}
