/* core/fiber.c: two coroutines on one thread (ucontext), switched only by
 * bg__pair_yield, so which code runs between two switches is decided by the
 * lanes themselves. AddressSanitizer is told of every stack switch (it still
 * prints, once per process, that it "doesn't fully support swapcontext"). */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "core/check.h"
#include "core/fiber.h"

#if defined(__SANITIZE_ADDRESS__)
#define BG__FIBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BG__FIBER_ASAN 1
#endif
#endif
#ifdef BG__FIBER_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

typedef struct lane {
    ucontext_t ctx;
    char *map;          /* the mapping: a guard page, then the stack */
    size_t map_bytes;
    char *stack;        /* usable stack */
    size_t stack_bytes;
    bg_pair_fn fn;
    void *arg;
    bg_status_t st;
    int done;
} lane_t;

struct bg_pair {
    ucontext_t main;
    lane_t lane[2];
    int cur;                 /* the running lane */
    char (*msg)[256];        /* bg__pair_run's msg_p */
    const void *main_bottom; /* the caller's stack, for ASan */
    size_t main_size;
};

static _Thread_local bg_pair_t *running; /* the pair this thread is inside, or NULL */

/* ASan: announce a switch to the stack [bottom, bottom + size) (save:
 * where the leaving context's fake stack is kept; NULL when it ends), and
 * finish one (the stack we came from, when asked). */
static void switch_begin(void **save, const void *bottom, size_t size)
{
#ifdef BG__FIBER_ASAN
    __sanitizer_start_switch_fiber(save, bottom, size);
#else
    (void)save, (void)bottom, (void)size;
#endif
}

static void switch_end(void *save, const void **from_bottom, size_t *from_size)
{
#ifdef BG__FIBER_ASAN
    __sanitizer_finish_switch_fiber(save, from_bottom, from_size);
#else
    (void)save, (void)from_bottom, (void)from_size;
#endif
}

/* The end of a lane: run the partner if it is not done, else go back to the caller. */
static void lane_exit(bg_pair_t *p)
{
    int o = 1 - p->cur;
    if (!p->lane[o].done) {
        p->cur = o;
        switch_begin(NULL, p->lane[o].stack, p->lane[o].stack_bytes);
        setcontext(&p->lane[o].ctx);
    } else {
        switch_begin(NULL, p->main_bottom, p->main_size);
        setcontext(&p->main);
    }
}

static void trampoline(void)
{
    bg_pair_t *p = running;
    const void *bottom = NULL;
    size_t size = 0;
    switch_end(NULL, &bottom, &size);
    if (p->cur == 0) { /* lane 0 starts from the caller's stack */
        p->main_bottom = bottom;
        p->main_size = size;
    }
    lane_t *l = &p->lane[p->cur];
    l->st = l->fn(l->arg);
    if (l->st != BG_OK && p->msg)
        snprintf(p->msg[p->cur], sizeof(p->msg[p->cur]), "%s", bg_last_error());
    l->done = 1;
    lane_exit(p);
}

bg_status_t bg__pair_create(size_t stack_bytes, bg_pair_t **pair_p)
{
    bg_pair_t *p = calloc(1, sizeof(*p));
    BG_ALLOC_CHECK(p, sizeof(*p), "coroutine pair");
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    stack_bytes = (stack_bytes + page - 1) / page * page;
    for (int i = 0; i < 2; i++) {
        lane_t *l = &p->lane[i];
        l->map_bytes = stack_bytes + page;
        l->map = mmap(NULL, l->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (l->map == MAP_FAILED || mprotect(l->map, page, PROT_NONE) != 0) {
            int e = errno;
            if (l->map == MAP_FAILED)
                l->map = NULL;
            bg__pair_destroy(p);
            return bg_error(BG_ERR_NOMEM, "coroutine stack of %zu bytes: %s", stack_bytes, strerror(e));
        }
        l->stack = l->map + page;
        l->stack_bytes = stack_bytes;
    }
    *pair_p = p;
    return BG_OK;
}

void bg__pair_destroy(bg_pair_t *p)
{
    if (!p)
        return;
    for (int i = 0; i < 2; i++)
        if (p->lane[i].map)
            munmap(p->lane[i].map, p->lane[i].map_bytes);
    free(p);
}

void bg__pair_run(bg_pair_t *p, bg_pair_fn fn0, void *arg0, bg_pair_fn fn1, void *arg1, bg_status_t st_p[2],
                  char (*msg_p)[256])
{
    bg_pair_fn fn[2] = {fn0, fn1};
    void *arg[2] = {arg0, arg1};
    for (int i = 0; i < 2; i++) {
        lane_t *l = &p->lane[i];
        l->fn = fn[i];
        l->arg = arg[i];
        l->st = BG_OK;
        l->done = 0;
        getcontext(&l->ctx);
        l->ctx.uc_stack.ss_sp = l->stack;
        l->ctx.uc_stack.ss_size = l->stack_bytes;
        l->ctx.uc_link = NULL;
        makecontext(&l->ctx, trampoline, 0);
        if (msg_p)
            msg_p[i][0] = '\0';
    }
    p->msg = msg_p;
    p->cur = 0;
    running = p;
    void *save = NULL;
    switch_begin(&save, p->lane[0].stack, p->lane[0].stack_bytes);
    swapcontext(&p->main, &p->lane[0].ctx);
    switch_end(save, NULL, NULL);
    running = NULL;
    for (int i = 0; i < 2; i++)
        st_p[i] = p->lane[i].st;
}

int bg__pair_busy(void) { return running && !running->lane[1 - running->cur].done; }

int bg__pair_yield(void)
{
    bg_pair_t *p = running;
    if (!bg__pair_busy())
        return 0;
    int me = p->cur, o = 1 - me;
    p->cur = o;
    void *save = NULL;
    switch_begin(&save, p->lane[o].stack, p->lane[o].stack_bytes);
    swapcontext(&p->lane[me].ctx, &p->lane[o].ctx);
    switch_end(save, NULL, NULL);
    return 1;
}

int bg__pair_lane(void) { return running ? running->cur : 0; }

int bg__pair_wait_turn(int *idle_p)
{
    if (!bg__pair_busy())
        return 0;
    if (++*idle_p > 32)
        sched_yield();
    return bg__pair_yield();
}
