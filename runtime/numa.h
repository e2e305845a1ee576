/* runtime/numa.h: bind a rank's threads and memory to a NUMA node. */
#ifndef BG_RUNTIME_NUMA_H
#define BG_RUNTIME_NUMA_H
#include "brigade/status.h"
/* *node_p: the node bound to, or -1 when nothing was bound (off, one node
 * under auto, or NUMA unavailable). */
bg_status_t bg__numa_bind(int local_rank, int *node_p);
#endif
