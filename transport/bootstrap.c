/* transport/bootstrap.c: where rank, world size, local rank and the store's
 * address come from. Order: explicit params, brigade's variables (through the
 * config table), torchrun's, Open MPI's, Slurm's; a world of one needs none.
 * Reads the foreign launchers' variables with getenv (core/config.c owns only
 * the BRIGADE_* ones). Must not touch sockets or UCX. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "transport/transport_impl.h"

static const char *bg__env(const char *name)
{
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

static bg_status_t bg__int(const char *name, const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return bg_error(BG_ERR_INVALID, "bootstrap: %s=\"%s\" is not an integer in [%ld, %ld]", name,
                        s, lo, hi);
    *out = (int)v;
    return BG_OK;
}

/* Port derived from a launcher's job id, so that every rank agrees without
 * talking: 20000 + (FNV-1a(job id) mod 12000), below Linux's ephemeral range
 * (32768-60999) so that it does not collide with outgoing connections. */
static int bg__port_from_job(const char *job)
{
    uint32_t h = 2166136261u;
    for (const char *p = job; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    return 20000 + (int)(h % 12000u);
}

bg_status_t bg__bootstrap(const bg_comm_params_t *p, bg__boot_t *b)
{
    struct { const char *src, *rank, *size, *local; } tab[] = {
        {"brigade", "BRIGADE_RANK", "BRIGADE_WORLD_SIZE", "BRIGADE_LOCAL_RANK"},
        {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
        {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    };
    memset(b, 0, sizeof(*b));
    b->rank = 0;
    b->size = 1;
    b->local_rank = -1;
    b->source = "single";
    int found = -1;
    for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
        const char *r = i == 0 ? bg_config_str(tab[i].rank) : bg__env(tab[i].rank);
        if (!r || !*r)
            continue;
        const char *s = i == 0 ? bg_config_str(tab[i].size) : bg__env(tab[i].size);
        if (!s || !*s)
            return bg_error(BG_ERR_INVALID, "bootstrap: %s is set but %s is not", tab[i].rank,
                            tab[i].size);
        BG_CHECK(bg__int(tab[i].size, s, 1, BG__MAX_RANKS - 1, &b->size));
        BG_CHECK(bg__int(tab[i].rank, r, 0, b->size - 1, &b->rank));
        const char *l = i == 0 ? bg_config_str(tab[i].local) : bg__env(tab[i].local);
        if (l && *l)
            BG_CHECK(bg__int(tab[i].local, l, 0, BG__MAX_RANKS - 1, &b->local_rank));
        b->source = tab[i].src;
        found = (int)i;
        break;
    }
    if (p->world_size > 0) {
        b->size = p->world_size;
        b->source = "params";
    }
    if (p->rank >= 0)
        b->rank = p->rank;
    if (p->local_rank >= 0)
        b->local_rank = p->local_rank;
    if (b->size < 1 || b->rank < 0 || b->rank >= b->size)
        return bg_error(BG_ERR_INVALID, "bootstrap: rank %d is outside a world of %d", b->rank, b->size);
    if (b->local_rank < 0)
        b->local_rank = b->rank; /* one machine assumed when nobody says otherwise */

    /* rendezvous address */
    const char *addr = bg_config_str("BRIGADE_MASTER_ADDR");
    if (found >= 1 && bg__env("MASTER_ADDR"))
        addr = bg__env("MASTER_ADDR");
    if (p->master_addr)
        addr = p->master_addr;
    snprintf(b->addr, sizeof(b->addr), "%s", addr && *addr ? addr : "127.0.0.1");

    long long port = 0;
    BG_CHECK(bg_config_int("BRIGADE_MASTER_PORT", &port));
    if (found == 1 && bg__env("MASTER_PORT")) {
        int v = 0;
        BG_CHECK(bg__int("MASTER_PORT", bg__env("MASTER_PORT"), 1, 65535, &v));
        port = v;
    } else if (found >= 2) {
        /* Open MPI / Slurm: MASTER_PORT if given, else BRIGADE_MASTER_PORT if set to
         * something other than its default, else a port derived from the job id. */
        const char *dflt = "29500";
        const char *cur = bg_config_str("BRIGADE_MASTER_PORT");
        const char *job = found == 2 ? bg__env("OMPI_MCA_ess_base_jobid") : bg__env("SLURM_JOB_ID");
        char hnp[64];
        if (found == 2 && !job && bg__env("OMPI_MCA_orte_hnp_uri")) {
            snprintf(hnp, sizeof(hnp), "%s", bg__env("OMPI_MCA_orte_hnp_uri"));
            hnp[strcspn(hnp, ";")] = '\0';
            job = hnp;
        }
        if (bg__env("MASTER_PORT")) {
            int v = 0;
            BG_CHECK(bg__int("MASTER_PORT", bg__env("MASTER_PORT"), 1, 65535, &v));
            port = v;
        } else if (strcmp(cur, dflt) == 0 && job) {
            port = bg__port_from_job(job);
        }
    }
    if (p->master_port > 0)
        port = p->master_port;
    if (b->size == 1 && p->master_port <= 0)
        port = 0; /* a world of one: an ephemeral port, nothing to agree on */
    if (port < 0 || port > 65535)
        return bg_error(BG_ERR_INVALID, "bootstrap: master port %lld is not in [1, 65535]", port);
    b->port = (int)port;
    return BG_OK;
}

bg_status_t bg_comm_env_world(int *world_p)
{
    bg_comm_params_t p = BG_COMM_PARAMS_INIT;
    bg__boot_t b;
    BG_CHECK(bg__bootstrap(&p, &b));
    *world_p = b.size;
    return BG_OK;
}
