/* schedule/program.c: a user's program to run (brigade train
 * --schedule-json): read, proved correct and checked against the job's shape
 * before any rank connects. Reading is json.c's, proof validate.c's; this
 * file only ties them together and says which file a message is about. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/check.h"
#include "schedule/schedule_impl.h"

/* The largest file a program of this job's shape can be: per rank, chunk and
 * microbatch at most BG_PROGRAM_OPS_PER_MB instructions (forward, backward or
 * its two halves, two sends, two receives: 7 of them), BG_PROGRAM_OPS_PER_RANK
 * more per rank, each at most BG_PROGRAM_OP_BYTES written out (the longest
 * instruction, pretty-printed, is about 150 bytes), and the header. A larger
 * file is refused before it is read: parsing a 124 MB file took 26 s and
 * 1.6 GB on every rank before its size was found wrong. */
#define BG_PROGRAM_OPS_PER_MB 16
#define BG_PROGRAM_OPS_PER_RANK 64
#define BG_PROGRAM_OP_BYTES 512
#define BG_PROGRAM_MAX_CHUNKS 64 /* json.c's bound when the job does not say */

static bg_status_t program_size_check(const char *path, int ranks, int microbatches, int chunks)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return bg_error(BG_ERR_IO, "cannot open schedule file %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return BG_OK; /* a pipe: its size is not known before reading */
    double v = chunks > 0 ? chunks : BG_PROGRAM_MAX_CHUNKS;
    double ops = (double)ranks * (v * microbatches * BG_PROGRAM_OPS_PER_MB + BG_PROGRAM_OPS_PER_RANK);
    double limit = ops * BG_PROGRAM_OP_BYTES + 65536.0 * (1.0 + ranks * v / 64.0); /* the header and stage map */
    if ((double)sb.st_size > limit)
        return bg_error(BG_ERR_INVALID, "%s is %lld bytes, larger than any program for %d pipeline ranks x %d "
                        "microbatches x %s%d chunks can be (%.0f bytes): refused before reading it", path,
                        (long long)sb.st_size, ranks, microbatches, chunks > 0 ? "" : "up to ", (int)v, limit);
    return BG_OK;
}

bg_status_t bg_schedule_load_program(const char *path, int ranks, int microbatches, int chunks,
                                     bg_schedule_t **sched_p)
{
    if (!path || !sched_p)
        return bg_error(BG_ERR_INVALID, "bg_schedule_load_program: no file");
    bg_schedule_t *s = NULL;
    BG_CHECK(program_size_check(path, ranks, microbatches, chunks));
    BG_CHECK(bg_schedule_from_json_file(path, &s));
    bg_status_t st = BG_OK;
    if (s->p != ranks) {
        st = bg_error(BG_ERR_INVALID, "%s is a program for p=%d pipeline ranks, but the job has %d (--pp)", path, s->p,
                      ranks);
    } else if (s->m != microbatches) {
        st = bg_error(BG_ERR_INVALID, "%s is a program for m=%d microbatches, but the job runs %d (--microbatches)",
                      path, s->m, microbatches);
    } else if (chunks > 0 && s->v != chunks) {
        st = bg_error(BG_ERR_INVALID, "%s places %d chunks per rank, but the job asks for %d (--chunks)", path, s->v,
                      chunks);
    } else if ((st = bg_schedule_validate(s)) != BG_OK) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", bg_last_error());
        bg_error(st, "%s does not validate: %s", path, msg);
    }
    if (st != BG_OK) {
        bg_schedule_free(s);
        return st;
    }
    /* whatever name the file gives, this is no generator's program: traces and
     * checkpoints record it as custom (and never as a name to regenerate) */
    s->kind = BG_SCHED_CUSTOM;
    snprintf(s->name, sizeof s->name, "custom");
    *sched_p = s;
    return BG_OK;
}
