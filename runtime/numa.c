/* runtime/numa.c: NUMA placement of a rank. With BRIGADE_NUMA=auto (machines
 * with more than one node) or on, the process's threads run on, and its memory
 * is preferably allocated from, node local_rank % nodes. Where libnuma reports
 * NUMA unavailable it is a no-op that says so (once, at info level, or as a
 * warning when BRIGADE_NUMA=on asked for it). */
#include <numa.h>
#include <string.h>

#include "core/check.h"
#include "runtime/numa.h"

bg_status_t bg__numa_bind(int local_rank, int *node_p)
{
    const char *mode = bg_config_str("BRIGADE_NUMA");
    *node_p = -1;
    if (!strcmp(mode, "off"))
        return BG_OK;
    if (strcmp(mode, "on") && strcmp(mode, "auto"))
        return bg_error(BG_ERR_INVALID, "BRIGADE_NUMA=\"%s\": expected auto, on or off", mode);
    if (numa_available() < 0) {
        bg_log(!strcmp(mode, "on") ? BG_LOG_WARN : BG_LOG_INFO, "numa",
               "libnuma reports NUMA unavailable: no binding (BRIGADE_NUMA=%s)", mode);
        return BG_OK;
    }
    int nodes = numa_max_node() + 1;
    if (nodes <= 1 && !strcmp(mode, "auto")) {
        bg_log(BG_LOG_INFO, "numa", "one NUMA node: nothing to bind (BRIGADE_NUMA=auto)");
        return BG_OK;
    }
    int node = (local_rank < 0 ? 0 : local_rank) % nodes;
    if (numa_run_on_node(node) != 0)
        return bg_error(BG_ERR_INTERNAL, "cannot run local rank %d on NUMA node %d", local_rank, node);
    numa_set_preferred(node);
    bg_log(BG_LOG_INFO, "numa", "local rank %d bound to NUMA node %d of %d", local_rank, node, nodes);
    *node_p = node;
    return BG_OK;
}
