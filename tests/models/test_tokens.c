/* tests/models/test_tokens.c: token files' sampling (models/tokens.c through
 * bg_data_open_tokens): every window exactly once per epoch, a new order each
 * epoch and seed, targets the next tokens, windows never crossing shards, and
 * the data position (bg_data_set_position) as the sequence count. Files whose
 * token j is j / T make each window's first token its index. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "brigade/model.h"

enum { T = 8, W = 37 };

/* A raw16 file of windows [first, first + n): token j of the file is first + j / T. */
static void write_file(const char *path, int first, int n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int j = 0; j < n * T + 1; j++) {
        uint16_t t = (uint16_t)(first + j / T);
        assert_int_equal(fwrite(&t, 2, 1, f), 1);
    }
    fclose(f);
}

/* The windows of step `step` (batch = W sequences), checking each sequence's tokens and targets. */
static void windows(bg_data_t *d, int64_t step, int *w)
{
    int32_t tok[W * T], tgt[W * T];
    assert_int_equal(bg_data_batch(d, step, 0, W, T, tok, NULL, tgt), BG_OK);
    for (int j = 0; j < W; j++) {
        w[j] = tok[j * T];
        for (int k = 0; k < T; k++) {
            assert_int_equal(tok[j * T + k], w[j]); /* a window of the file, whole */
            assert_int_equal(tgt[j * T + k], k + 1 < T ? w[j] : w[j] + 1); /* the next token */
        }
    }
}

static void is_permutation(const int *w)
{
    int seen[W] = {0};
    for (int j = 0; j < W; j++) {
        assert_true(w[j] >= 0 && w[j] < W);
        seen[w[j]]++;
    }
    for (int j = 0; j < W; j++)
        assert_int_equal(seen[j], 1);
}

static void epochs(void **state)
{
    (void)state;
    char path[64];
    snprintf(path, sizeof path, "/tmp/bg-tokens-%d.bin", (int)getpid());
    write_file(path, 0, W);
    bg_data_t *d = NULL, *e = NULL;
    assert_int_equal(bg_data_open_tokens(path, "raw16", T, W, W + 1, 7, &d), BG_OK);
    assert_int_equal(bg_data_open_tokens(path, "auto", T, W, W + 1, 8, &e), BG_OK);
    int a[W], b[W], c[W], ident = 0;
    windows(d, 0, a);
    windows(d, 1, b);
    windows(e, 0, c);
    is_permutation(a);
    is_permutation(b);
    is_permutation(c);
    for (int j = 0; j < W; j++)
        ident += a[j] == j;
    assert_true(ident < W / 2);                     /* shuffled */
    assert_memory_not_equal(a, b, sizeof a);        /* another order next epoch */
    assert_memory_not_equal(a, c, sizeof a);        /* and for another seed */
    /* the position: step 5 starting at sequence 3 is sequences 3, 4, ... of epoch 0 */
    bg_data_set_position(d, 5, 3);
    assert_int_equal(bg_data_position(d, 5), 3);
    assert_int_equal(bg_data_position(d, 6), 3 + W);
    int32_t tok[2 * T];
    assert_int_equal(bg_data_batch(d, 5, 0, 2, T, tok, NULL, NULL), BG_OK);
    assert_int_equal(tok[0], a[3]);
    assert_int_equal(tok[T], a[4]);
    bg_data_close(d);
    bg_data_close(e);
    unlink(path);
}

static void shards(void **state)
{
    (void)state;
    char p0[64], p1[64], list[160];
    snprintf(p0, sizeof p0, "/tmp/bg-tokens-%d-0.bin", (int)getpid());
    snprintf(p1, sizeof p1, "/tmp/bg-tokens-%d-1.bin", (int)getpid());
    write_file(p0, 0, 20);  /* windows 0..19 */
    write_file(p1, 20, 17); /* windows 20..36: none spans the two files */
    snprintf(list, sizeof list, "%s,%s", p0, p1);
    bg_data_t *d = NULL;
    assert_int_equal(bg_data_open_tokens(list, "raw16", T, W, W + 1, 3, &d), BG_OK);
    int a[W];
    windows(d, 0, a); /* checks each window is whole, targets included */
    is_permutation(a);
    bg_data_close(d);
    assert_int_equal(bg_data_open_tokens(list, "raw16", T, W, W, 3, &d), BG_ERR_INVALID); /* its last token, 37, >= vocab 37 */
    assert_non_null(strstr(bg_last_error(), p1));
    unlink(p0);
    unlink(p1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(epochs), cmocka_unit_test(shards)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
