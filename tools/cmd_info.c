/* tools/cmd_info.c: `brigade info`: version, backends, the CPU and the BLAS
 * in use (with a warning when its kernels are below the CPU), configuration
 * table. */
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

int bg_cmd_info(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: brigade info\n  prints the version, the compiled-in backends (whether each device backend\n"
               "  can start here, how its buffers travel between ranks), the providers of the group collectives\n"
               "  on backend buffers (and which each backend's groups use), the CPU, the BLAS and its kernels,\n"
               "  which library (OpenBLAS or oneDNN) runs each GEMM layout, and every BRIGADE_* variable\n");
        return 0;
    }
    if (argc > 1)
        return bg_cli_fail("info", "takes no arguments, got \"%s\"", argv[1]);
    printf("brigade %s\nbackends:", BRIGADE_VERSION_STRING);
    for (const char *const *n = bg_backend_names(); *n; n++)
        printf(" %s", *n);
    printf("\n");
    /* always compiled in (kernels/backend.c) */
    printf("cpu-async: the CPU kernels behind an emulated copy stream and events (tests the streams path)\n");
    for (const char *const *n = bg_backend_names(); *n; n++) { /* can the device backends start here? */
        if (!strncmp(*n, "cpu", 3)) /* cpu, and cpu-async (the CPU with emulated streams, for tests) */
            continue;
        bg_backend_t *dbe = NULL;
        if (bg_backend_create(*n, NULL, &dbe) == BG_OK) {
            printf("%s: device 0 usable", *n);
            bg_backend_destroy(dbe);
        } else {
            printf("%s: compiled in, not usable here: %s", *n, bg_last_error());
        }
        printf("\n%s: device buffers between ranks: %s\n", *n, bg_executor_device_transport());
    }
    printf("transport: UCX %s\n", bg_transport_ucx_version());
    printf("collectives on backend buffers (BRIGADE_COLL=%s), providers:\n%s\n", bg_config_str("BRIGADE_COLL"),
           bg_executor_collective_providers());
    bg_cpu_info_t cpu;
    bg_cpu_info(&cpu);
    printf("cpu: %s family %d model %d \"%s\":%s%s%s%s, fp32 FMA vectors %d bits\n", cpu.vendor, cpu.family,
           cpu.model, cpu.brand, cpu.avx ? " avx" : "", cpu.avx2_fma ? " avx2 fma" : "",
           cpu.avx512 ? " avx512(f,bw,dq,vl)" : "", cpu.amx ? " amx" : "", cpu.vector_bits);
    bg_cpu_isa_t isa;
    if (bg_cpu_isa(&isa) == BG_OK)
        printf("cpu kernels: %s (BRIGADE_CPU_ISA=%s)\n", bg_cpu_isa_name(isa), bg_config_str("BRIGADE_CPU_ISA"));
    else
        printf("cpu kernels: none: %s\n", bg_last_error());
    bg_gemm_info_t g;
    int gemm_ok = bg_gemm_info(&g) == BG_OK;
    /* "oneDNN" or "oneDNN after transpose" (BRIGADE_GEMM_TRANSPOSE) */
    int dnnl_all = gemm_ok && !strncmp(g.nn, "oneDNN", 6) && !strncmp(g.nt, "oneDNN", 6) &&
                   !strncmp(g.tn, "oneDNN", 6) && !strncmp(g.tn_tall, "oneDNN", 6);
    char gemm_error[512];
    snprintf(gemm_error, sizeof(gemm_error), "%s", gemm_ok ? "" : bg_last_error());
    bg_blas_info_t b;
    if (bg_blas_info(&b) != BG_OK) {
        printf("blas: none: %s\n", bg_last_error());
    } else {
        printf("blas: %s, %s\n      version: %s\n      kernels: core %s (chosen by %s)\n", b.library, b.path,
               b.version, b.core, b.chosen_by);
        if (b.fallback && dnnl_all)
            printf("note: OpenBLAS's \"%s\" kernels are a fallback below this CPU, but every GEMM runs on oneDNN\n",
                   b.core);
        else if (b.fallback)
            printf("warning: OpenBLAS's \"%s\" kernels are a fallback below this CPU (%s): GEMM runs at a "
                   "fraction of its speed; unset OPENBLAS_CORETYPE and BRIGADE_BLAS_CORE, or set "
                   "OPENBLAS_CORETYPE=%s\n",
                   b.core, cpu.avx512 ? "AVX-512" : cpu.avx2_fma ? "AVX2" : "AVX",
                   cpu.avx512 ? "SkylakeX" : cpu.avx2_fma ? "Haswell (Zen on AMD)" : "Sandybridge");
    }
    if (!gemm_ok)
        printf("gemm: %s\n", gemm_error);
    else
        printf("gemm: A B %s, A B^T %s, A^T B %s (m > n: %s) (BRIGADE_GEMM=%s, BRIGADE_GEMM_TRANSPOSE=%s); "
               "oneDNN: %s%s%s\n", g.nn, g.nt, g.tn, g.tn_tall, g.mode, bg_config_str("BRIGADE_GEMM_TRANSPOSE"),
               g.onednn ? g.onednn_version : "not used: ", g.onednn ? ", " : "", g.onednn ? g.onednn_path : g.onednn_why);
    if (gemm_ok)
        printf("gemm under --precision bf16: %s%s%s\n", g.bf16 ? "inputs rounded to bf16, fp32 accumulation, oneDNN " : "fp32 (",
               g.bf16 ? g.bf16 : g.bf16_why ? g.bf16_why : "?", g.bf16 ? "" : ")");
    printf("\nenvironment variables (current value, default, meaning):\n");
    size_t count;
    const bg_config_var_t *t = bg_config_table(&count);
    for (size_t i = 0; i < count; i++) {
        const char *v = getenv(t[i].name);
        printf("  %-30s %-8s (default \"%s\")  %s\n", t[i].name, v ? v : "-", t[i].dflt, t[i].help);
    }
    return 0;
}
