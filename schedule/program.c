/* schedule/program.c: a user's program to run (brigade train
 * --schedule-json): read, proved correct and checked against the job's shape
 * before any rank connects. Reading is json.c's, proof validate.c's; this
 * file only ties them together and says which file a message is about. */
#include <stdio.h>

#include "core/check.h"
#include "schedule/schedule_impl.h"

bg_status_t bg_schedule_load_program(const char *path, int ranks, int microbatches, int chunks,
                                     bg_schedule_t **sched_p)
{
    if (!path || !sched_p)
        return bg_error(BG_ERR_INVALID, "bg_schedule_load_program: no file");
    bg_schedule_t *s = NULL;
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
