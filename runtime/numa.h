/* runtime/numa.h: bind a rank's threads and memory to a NUMA node. */
#ifndef BG_RUNTIME_NUMA_H
#define BG_RUNTIME_NUMA_H
#include <stddef.h>

#include "brigade/backend.h"
#include "brigade/status.h"

/* The NUMA node of the PCI device bus_id ("0000:3b:00.0"; CUDA's 8-digit
 * domains and upper case accepted) read from
 * <sysfs_root>/bus/pci/devices/<id>/numa_node ("/sys" on a machine, a test
 * directory in tests); -1 when unknown (no such file, -1 in it, a malformed id). */
int bg__numa_node_of_pci(const char *sysfs_root, const char *bus_id);
/* The node of the backend's device (ops->pci_bus_id, written to bus_id), or
 * -1: no device, or its node unknown. */
int bg__numa_device_node(bg_backend_t *be, const char *sysfs_root, char *bus_id, size_t len);
/* Binds to device_node when it is a node of this machine (device: its bus id,
 * for the log; NULL or "" when there is none), else to local_rank % nodes.
 * *node_p: the node bound to, or -1 when nothing was bound (off, one node
 * under auto, or NUMA unavailable). */
bg_status_t bg__numa_bind(int local_rank, int device_node, const char *device, int *node_p);
#endif
