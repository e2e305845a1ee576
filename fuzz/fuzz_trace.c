/* fuzz/fuzz_trace.c: the executor trace reader of `brigade simulate
 * --from-trace` (bg_trace_costs_parse) on arbitrary bytes, then the
 * simulator on what it read when the schedule is small. */
#include "brigade/schedule.h"
#include "fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bg_fuzz_init();
    bg_trace_costs_t *c = NULL;
    if (bg_trace_costs_parse((const char *)data, size, "fuzz.json", &c) != BG_OK)
        return 0;
    bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
    bg_trace_costs_schedule(c, &sp);
    int steps;
    (void)bg_trace_costs_step_time(c, &steps);
    bg_schedule_t *s = NULL;
    if ((long)sp.stages * sp.microbatches * sp.chunks <= 64 && bg_schedule_generate(&sp, &s) == BG_OK) {
        bg_sim_params_t simp = BG_SIM_PARAMS_INIT;
        bg_trace_costs_sim(c, steps & 1, &simp);
        bg_sim_result_t *r = NULL;
        if (bg_schedule_simulate(s, &simp, &r) == BG_OK)
            bg_sim_result_free(r);
        bg_schedule_free(s);
    }
    bg_trace_costs_free(c);
    return 0;
}
