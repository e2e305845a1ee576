/* fuzz/fuzz_plan.c: the plan reader (bg_plan_from_json) on arbitrary text; a
 * plan it accepts must write back (bg_plan_to_json) into text it accepts. */
#include "brigade/partitioner.h"
#include "fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bg_fuzz_init();
    char *text = bg_fuzz_cstr(data, size);
    if (!text)
        return 0;
    bg_plan_t *p = NULL;
    if (bg_plan_from_json(text, &p) == BG_OK) {
        char *again = NULL;
        if (bg_plan_to_json(p, &again) == BG_OK) {
            bg_plan_t *q = NULL;
            if (bg_plan_from_json(again, &q) != BG_OK)
                abort(); /* a plan the library wrote that it cannot read */
            bg_plan_free(q);
            free(again);
        }
        bg_plan_free(p);
    }
    free(text);
    return 0;
}
