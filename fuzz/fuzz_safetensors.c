/* fuzz/fuzz_safetensors.c: the safetensors reader (models/safetensors.h) on
 * arbitrary bytes: a file that passes bg__st_parse must be safe to use in
 * every way the library uses one (find by name, check a shape, copy every
 * tensor, checksum its bytes, read the metadata). */
#include "fuzz/fuzz.h"
#include "models/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bg_fuzz_init();
    /* the reader keeps pointers into the buffer: give it a copy of exactly size bytes */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    bg__st_file_t *f;
    if (bg__st_parse("fuzz.safetensors", buf, size, &f) == BG_OK) {
        (void)bg__st_metadata(f);
        for (int i = 0; i < bg__st_count(f); i++) {
            const bg__st_tensor_t *t = bg__st_tensor(f, i);
            if (bg__st_find(f, t->name) != t)
                abort();
            if (bg__st_check_shape(f, t, t->ndim, t->shape) != BG_OK)
                abort();
            if (t->end - t->begin != 4 * (uint64_t)t->numel || t->end > size)
                abort();
            float *dst = malloc(t->numel ? t->numel * sizeof(float) : 1);
            if (dst) {
                bg__st_copy(t, NULL, dst);
                free(dst);
            }
            (void)bg__crc32c(0, t->data, t->end - t->begin);
        }
        bg__st_close(f);
    }
    free(buf);
    return 0;
}
