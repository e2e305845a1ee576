/* fuzz/fuzz_manifest.c: the checkpoint manifest reader (runtime/checkpoint.c)
 * on arbitrary bytes. A manifest carries its own CRC32C, which random bytes
 * almost never match; so each input is read twice: as is (the checksum and
 * format checks), and, when it is a JSON object, with its checksum made
 * right (everything behind the checksum: step, model, files[], extra). */
#include <jansson.h>

#include "fuzz/fuzz.h"
#include "models/safetensors.h"
#include "runtime/checkpoint_impl.h"

#define MANIFEST_FLAGS (JSON_INDENT(1) | JSON_SORT_KEYS)

static void read_once(const char *text, size_t n)
{
    bg_checkpoint_info_t info;
    if (bg__checkpoint_info_parse("fuzz/manifest.json", text, n, &info) == BG_OK)
        bg_checkpoint_info_clear(&info);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bg_fuzz_init();
    read_once((const char *)data, size);
    json_t *m = json_loadb((const char *)data, size, 0, NULL);
    if (json_is_object(m)) {
        /* as runtime/checkpoint.c writes it: the checksum over the text without it */
        json_object_del(m, "manifest_crc32c");
        char *body = json_dumps(m, MANIFEST_FLAGS);
        if (body) {
            json_object_set_new(m, "manifest_crc32c", json_integer(bg__crc32c(0, body, strlen(body))));
            free(body);
            char *text = json_dumps(m, MANIFEST_FLAGS);
            if (text)
                read_once(text, strlen(text));
            free(text);
        }
    }
    json_decref(m);
    return 0;
}
