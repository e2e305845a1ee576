/* tests/bg_test_capture.h: what a host program would see of brigade's output.
 * bgt_capture_begin/end redirect file descriptors 1 and 2 to a temporary file
 * and give back what was written there; bgt_sink is a log sink that records
 * the messages it receives. Assert only after bgt_capture_end, or a failure's
 * message ends up in the file. */
#ifndef BG_TEST_CAPTURE_H
#define BG_TEST_CAPTURE_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "brigade/core.h"

typedef struct bgt_capture {
    int saved[2]; /* the original fds 1 and 2 */
    int fd;       /* the temporary file both point to meanwhile */
} bgt_capture_t;

/* 0 when fds 1 and 2 now write to a fresh temporary file. */
static inline int bgt_capture_begin(bgt_capture_t *c)
{
    char path[] = "/tmp/bgt_capture_XXXXXX";
    c->saved[0] = c->saved[1] = -1;
    fflush(stdout);
    fflush(stderr);
    c->fd = mkstemp(path);
    if (c->fd < 0)
        return -1;
    unlink(path);
    c->saved[0] = dup(1);
    c->saved[1] = dup(2);
    if (c->saved[0] < 0 || c->saved[1] < 0 || dup2(c->fd, 1) < 0 || dup2(c->fd, 2) < 0)
        return -1;
    return 0;
}

/* Restore fds 1 and 2; copy what was written meanwhile into buf (NUL-terminated,
 * at most cap - 1 bytes) and return its length (-1 on an error). */
static inline long bgt_capture_end(bgt_capture_t *c, char *buf, size_t cap)
{
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < 2; i++)
        if (c->saved[i] >= 0) {
            dup2(c->saved[i], i + 1);
            close(c->saved[i]);
        }
    if (c->fd < 0)
        return -1;
    ssize_t n = pread(c->fd, buf, cap - 1, 0);
    close(c->fd);
    if (n < 0)
        return -1;
    buf[n] = 0;
    return (long)n;
}

#define BGT_SINK_MAX 256

/* The messages a sink received, in order. */
typedef struct bgt_sink {
    pthread_mutex_t lock; /* the sink's contract serialises calls; the lock makes the test not rely on it */
    int n;
    struct {
        bg_log_level_t level;
        int rank;
        pthread_t thread;
        char subsystem[32];
        char message[256];
    } m[BGT_SINK_MAX];
} bgt_sink_t;

static inline void bgt_sink(bg_log_level_t level, const char *subsystem, int rank, const char *message, void *arg)
{
    bgt_sink_t *s = arg;
    pthread_mutex_lock(&s->lock);
    if (s->n < BGT_SINK_MAX) {
        s->m[s->n].level = level;
        s->m[s->n].rank = rank;
        s->m[s->n].thread = pthread_self();
        snprintf(s->m[s->n].subsystem, sizeof(s->m[s->n].subsystem), "%s", subsystem);
        snprintf(s->m[s->n].message, sizeof(s->m[s->n].message), "%s", message);
        s->n++;
    }
    pthread_mutex_unlock(&s->lock);
}

static inline void bgt_sink_init(bgt_sink_t *s)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->lock, NULL);
}

/* Index of the first message of @p subsystem, -1 when none came. */
static inline int bgt_sink_find(bgt_sink_t *s, const char *subsystem)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->m[i].subsystem, subsystem))
            return i;
    return -1;
}

#endif
