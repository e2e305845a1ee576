/* tests/runtime/test_numa_sysfs.c: the NUMA node of a rank's GPU, read from a
 * fake sysfs tree (a temporary directory laid out as /sys/bus/pci/devices),
 * and the binding that uses it (runtime/numa.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <numa.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "brigade/brigade.h"
#include "bg_test_capture.h"
#include "runtime/numa.h"

static char root[64];

/* root/bus/pci/devices/<id>/numa_node holding text (NULL: no file) */
static void fake_device(const char *id, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/bus/pci/devices/%s", root, id);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", p);
    assert_int_equal(system(cmd), 0);
    if (!text)
        return;
    strcat(p, "/numa_node");
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/bg_sysfs_XXXXXX");
    if (!mkdtemp(root))
        return -1;
    fake_device("0000:3b:00.0", "1\n");
    fake_device("0000:86:00.0", "-1\n");   /* the firmware does not say */
    fake_device("0000:af:00.0", NULL);     /* no numa_node file */
    fake_device("0000:d8:00.0", "junk\n"); /* unreadable */
    fake_device("0001:00:1f.7", "3\n");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_lookup(void **state)
{
    (void)state;
    assert_int_equal(bg__numa_node_of_pci(root, "0000:3b:00.0"), 1);
    assert_int_equal(bg__numa_node_of_pci(root, "0000:3B:00.0"), 1);     /* upper case, as CUDA may write it */
    assert_int_equal(bg__numa_node_of_pci(root, "00000000:3B:00.0"), 1); /* 8-digit domain (NVML's form) */
    assert_int_equal(bg__numa_node_of_pci(root, "0001:00:1f.7"), 3);
    assert_int_equal(bg__numa_node_of_pci(root, "0000:86:00.0"), -1); /* -1 in the file */
    assert_int_equal(bg__numa_node_of_pci(root, "0000:af:00.0"), -1); /* no file */
    assert_int_equal(bg__numa_node_of_pci(root, "0000:d8:00.0"), -1); /* not a number */
    assert_int_equal(bg__numa_node_of_pci(root, "0000:99:00.0"), -1); /* no device */
    assert_int_equal(bg__numa_node_of_pci(root, "3b:00.0"), -1);      /* malformed ids */
    assert_int_equal(bg__numa_node_of_pci(root, "0000:3b:00.0x"), -1);
    assert_int_equal(bg__numa_node_of_pci(root, "0000:3b:00.9"), -1);
    assert_int_equal(bg__numa_node_of_pci(root, ""), -1);
    assert_int_equal(bg__numa_node_of_pci(root, NULL), -1);
    assert_int_equal(bg__numa_node_of_pci("/nonexistent", "0000:3b:00.0"), -1);
}

static const char *fake_id;
static int fake_pci_bus_id(bg_backend_t *be, char *buf, size_t len)
{
    (void)be;
    if (!fake_id)
        return -1;
    snprintf(buf, len, "%s", fake_id);
    return 0;
}

static void test_device_node(void **state)
{
    (void)state;
    bg_backend_ops_t ops = {.name = "fake", .pci_bus_id = fake_pci_bus_id};
    bg_backend_t be = {.ops = &ops};
    char bus[64];
    fake_id = "0000:3B:00.0";
    assert_int_equal(bg__numa_device_node(&be, root, bus, sizeof bus), 1);
    assert_string_equal(bus, "0000:3B:00.0");
    fake_id = "0000:86:00.0";
    assert_int_equal(bg__numa_device_node(&be, root, bus, sizeof bus), -1);
    fake_id = NULL; /* the backend cannot say */
    assert_int_equal(bg__numa_device_node(&be, root, bus, sizeof bus), -1);
    assert_string_equal(bus, "");
    ops.pci_bus_id = NULL; /* no device (cpu) */
    assert_int_equal(bg__numa_device_node(&be, root, bus, sizeof bus), -1);
    assert_string_equal(bus, "");
}

/* The binding: the device's node when it is one of this machine's, else
 * local_rank % nodes (whatever the machine: one node here is enough to see
 * both, a device node of 0 against an out-of-range one). */
static void test_bind(void **state)
{
    (void)state;
    if (numa_available() < 0) {
        int node = 5;
        setenv("BRIGADE_NUMA", "on", 1);
        assert_int_equal(bg__numa_bind(0, 0, "0000:3b:00.0", &node), BG_OK);
        assert_int_equal(node, -1);
        unsetenv("BRIGADE_NUMA");
        skip();
    }
    int nodes = numa_max_node() + 1, node = -2;
    static bgt_sink_t sink; /* the log says which rule chose the node (one node here: the same node either way) */
    bgt_sink_init(&sink);
    setenv("BRIGADE_LOG", "info", 1);
    bg_log_set_sink(bgt_sink, &sink);
    setenv("BRIGADE_NUMA", "on", 1);
    int b1 = bg__numa_bind(1, nodes - 1, "0000:3b:00.0", &node), n1 = node; /* the device's node */
    int b2 = bg__numa_bind(nodes + 1, nodes + 7, "0000:3b:00.0", &node), n2 = node; /* not a node: rank % nodes */
    bg_log_set_sink(NULL, NULL);
    unsetenv("BRIGADE_LOG");
    assert_int_equal(b1, BG_OK);
    assert_int_equal(n1, nodes - 1);
    assert_int_equal(b2, BG_OK);
    assert_int_equal(n2, (nodes + 1) % nodes);
    assert_int_equal(sink.n, 2);
    assert_non_null(strstr(sink.m[0].message, "bound to NUMA node"));
    assert_non_null(strstr(sink.m[0].message, "(its device 0000:3b:00.0's)"));
    assert_non_null(strstr(sink.m[1].message, "the node of device 0000:3b:00.0 is not a node of this machine"));
    assert_int_equal(bg__numa_bind(nodes + 1, -1, "0000:3b:00.0", &node), BG_OK); /* unknown */
    assert_int_equal(node, (nodes + 1) % nodes);
    assert_int_equal(bg__numa_bind(2 * nodes, 0, NULL, &node), BG_OK); /* no device */
    assert_int_equal(node, 0);
    setenv("BRIGADE_NUMA", "off", 1);
    assert_int_equal(bg__numa_bind(0, 0, "0000:3b:00.0", &node), BG_OK);
    assert_int_equal(node, -1);
    setenv("BRIGADE_NUMA", "bogus", 1);
    assert_int_equal(bg__numa_bind(0, 0, NULL, &node), BG_ERR_INVALID);
    unsetenv("BRIGADE_NUMA");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup),
        cmocka_unit_test(test_device_node),
        cmocka_unit_test(test_bind),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
