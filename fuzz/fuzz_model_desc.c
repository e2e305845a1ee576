/* fuzz/fuzz_model_desc.c: the model description JSON (models/desc.c) on
 * arbitrary text: bg_model_desc_from_json (rebuilds a builder-made model; a
 * rebuilt one must write back the same description) and
 * bg_model_desc_match_json against a fixed small GPT, as a checkpoint or plan
 * load compares the file's model with the running one. */
#include "brigade/model.h"
#include "fuzz/fuzz.h"
#include "tests/bg_test_model.h"

static bg_model_desc_t *reference(void)
{
    static bg_model_desc_t *d;
    if (!d) {
        bg_model_config_t c = bg_test_gpt_config(2, 8, 2, 8, 256, 1337); /* the default seed */
        c.tie_embeddings = 1;
        if (bg_model_build(&c, &d) != BG_OK)
            abort();
    }
    return d;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bg_fuzz_init();
    char *text = bg_fuzz_cstr(data, size);
    if (!text)
        return 0;
    (void)bg_model_desc_match_json(reference(), text, "fuzz");
    bg_model_desc_t *d = NULL;
    if (bg_model_desc_from_json(text, &d) == BG_OK) {
        char *again = NULL;
        if (bg_model_desc_to_json(d, &again) == BG_OK) {
            if (bg_model_desc_match_json(d, again, "round trip") != BG_OK)
                abort();
            free(again);
        }
        bg_model_desc_destroy(d);
    }
    free(text);
    return 0;
}
