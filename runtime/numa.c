/* runtime/numa.c: NUMA placement of a rank. With BRIGADE_NUMA=auto (machines
 * with more than one node) or on, the process's threads run on, and its memory
 * is preferably allocated from, the node of the rank's GPU where the backend
 * names one (ops->pci_bus_id, looked up in sysfs) and the node is known, else
 * node local_rank % nodes. Where libnuma reports NUMA unavailable it is a
 * no-op that says so (once, at info level, or as a warning when
 * BRIGADE_NUMA=on asked for it). */
#include <numa.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "runtime/numa.h"

int bg__numa_node_of_pci(const char *sysfs_root, const char *bus_id)
{
    unsigned dom = 0, bus = 0, dev = 0, fn = 0;
    char tail;
    /* CUDA writes the domain with 4 or 8 hex digits, in either case; sysfs
     * names it with 4, lower case */
    if (!bus_id || strspn(bus_id, "0123456789abcdefABCDEF:.") != strlen(bus_id) ||
        sscanf(bus_id, "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) != 4 || dom > 0xffff || bus > 0xff ||
        dev > 0x1f || fn > 7)
        return -1;
    char path[4096];
    if (snprintf(path, sizeof(path), "%s/bus/pci/devices/%04x:%02x:%02x.%x/numa_node", sysfs_root, dom, bus, dev,
                 fn) >= (int)sizeof(path))
        return -1;
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int node = -1;
    if (fscanf(f, "%d", &node) != 1 || node < 0)
        node = -1; /* -1: the firmware does not say */
    fclose(f);
    return node;
}

int bg__numa_device_node(bg_backend_t *be, const char *sysfs_root, char *bus_id, size_t len)
{
    if (len)
        bus_id[0] = 0;
    if (!be->ops->pci_bus_id || be->ops->pci_bus_id(be, bus_id, len) != 0)
        return -1;
    return bg__numa_node_of_pci(sysfs_root, bus_id);
}

bg_status_t bg__numa_bind(int local_rank, int device_node, const char *device, int *node_p)
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
    char why[160] = "";
    if (device && device[0] && device_node >= 0 && device_node < nodes) {
        node = device_node;
        snprintf(why, sizeof(why), " (its device %s's)", device);
    } else if (device && device[0]) {
        snprintf(why, sizeof(why), " (local rank %% nodes: the node of device %s is %s)", device,
                 device_node < 0 ? "unknown" : "not a node of this machine");
    }
    if (numa_run_on_node(node) != 0)
        return bg_error(BG_ERR_INTERNAL, "cannot run local rank %d on NUMA node %d", local_rank, node);
    numa_set_preferred(node);
    bg_log(BG_LOG_INFO, "numa", "local rank %d bound to NUMA node %d of %d%s", local_rank, node, nodes, why);
    *node_p = node;
    return BG_OK;
}
