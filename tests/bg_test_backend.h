/* tests/bg_test_backend.h: the one-thread CPU backend fixture shared by the
 * cmocka programs that build layers and models (cmocka group setup/teardown). */
#ifndef BG_TEST_BACKEND_H
#define BG_TEST_BACKEND_H

#include "brigade/brigade.h"

static bg_backend_t *be __attribute__((unused));

static int setup(void **state)
{
    (void)state;
    bg_backend_params_t p = BG_BACKEND_PARAMS_INIT;
    p.num_threads = 1; /* results do not depend on it; one thread keeps the tests quiet on 2 cores */
    return bg_backend_create("cpu", &p, &be) == BG_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    bg_backend_destroy(be);
    return 0;
}

#endif
