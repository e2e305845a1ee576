/* fuzz/fuzz_bootstrap.c: the bootstrap's environment parsing
 * (transport/bootstrap.c: rank, world size, local rank, the store's address
 * and port from brigade's, torchrun's, Open MPI's and Slurm's variables).
 *
 * Input: lines NAME=VALUE. Only the variables bootstrap reads are set (the
 * environment is cleared first); the others are ignored. */
#include "fuzz/fuzz.h"
#include "transport/transport_impl.h"

static const char *const names[] = {
    "BRIGADE_RANK", "BRIGADE_WORLD_SIZE", "BRIGADE_LOCAL_RANK", "BRIGADE_MASTER_ADDR", "BRIGADE_MASTER_PORT",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_MCA_ess_base_jobid",
    "OMPI_MCA_orte_hnp_uri", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bg_fuzz_init();
    char *text = bg_fuzz_cstr(data, size);
    if (!text)
        return 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        unsetenv(names[i]);
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(line, '=');
        if (!eq)
            continue;
        *eq = 0;
        for (size_t i = 0; i < sizeof names / sizeof *names; i++)
            if (!strcmp(line, names[i]))
                setenv(names[i], eq + 1, 1);
    }
    bg_comm_params_t p = BG_COMM_PARAMS_INIT;
    bg__boot_t b;
    if (bg__bootstrap(&p, &b) == BG_OK) {
        if (b.size < 1 || b.rank < 0 || b.rank >= b.size || b.port < 0 || b.port > 65535 || !memchr(b.addr, 0, sizeof b.addr))
            abort();
    }
    free(text);
    return 0;
}
