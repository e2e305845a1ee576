/* fuzz/fuzz_schedule.c: the schedule JSON reader (bg_schedule_from_json) on
 * arbitrary text, then what a user's schedule goes through: the validator,
 * and for small valid ones the simulator, the text table and the JSON writer
 * (whose output must read back). */
#include "brigade/schedule.h"
#include "fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bg_fuzz_init();
    char *text = bg_fuzz_cstr(data, size);
    if (!text)
        return 0;
    bg_schedule_t *s = NULL;
    if (bg_schedule_from_json(text, &s) == BG_OK) {
        char *t = NULL;
        if (bg_schedule_format_text(s, BG_SCHED_TEXT_COMM, &t) == BG_OK)
            free(t);
        char *again = NULL;
        if (bg_schedule_to_json(s, &again) == BG_OK) {
            bg_schedule_t *q = NULL;
            if (bg_schedule_from_json(again, &q) != BG_OK)
                abort(); /* a schedule the library wrote that it cannot read */
            bg_schedule_free(q);
            free(again);
        }
        if (bg_schedule_validate(s) == BG_OK) {
            bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
            sp.latency = 0.1;
            sp.bandwidth = 10;
            sp.act_bytes = 1;
            bg_sim_result_t *r = NULL;
            if (bg_schedule_simulate(s, &sp, &r) == BG_OK) {
                char *svg = NULL;
                if (bg_schedule_svg_string(s, r, &svg) == BG_OK)
                    free(svg);
                bg_sim_result_free(r);
            }
        }
        bg_schedule_free(s);
    }
    free(text);
    return 0;
}
