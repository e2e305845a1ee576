/* core/config.c: the one table of BRIGADE_* environment variables, and the
 * library's version (bg_version).
 * No other file calls getenv() for brigade's own settings (bootstrap reads
 * the foreign launchers' variables RANK, OMPI_*, SLURM_* itself). */
#include "brigade/core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const bg_config_var_t bg__config[] = {
    {"BRIGADE_LOG", "warn", "log level: error|warn|info|debug|trace (also what a host's log sink receives)"},
    {"BRIGADE_NUM_THREADS", "0", "compute threads per process (0: OpenMP's default)"},
    {"BRIGADE_BACKEND", "cpu", "kernel backend (brigade info lists the ones compiled in)"},
    {"BRIGADE_CUDA_GEMM", "fp32", "cuda backend GEMM arithmetic: fp32 (exact fp32)|tf32|bf16 (tensor cores: inputs rounded to tf32/bf16, fp32 accumulation, fp32 storage)"},
    {"BRIGADE_CUDA_ATTN", "auto", "cuda backend attention kernels: auto (tensor cores when BRIGADE_CUDA_GEMM is tf32 or bf16, else CUDA cores)|tc (tensor cores: tf32 operands, fp32 accumulation; head sizes up to 128, CUDA cores above)|simt (CUDA cores, exact fp32)"},
    {"BRIGADE_CPU_ISA", "auto", "vector ISA of the cpu backend's own kernels and of its BLAS (to measure a narrower CPU's speed on a wider one): auto (the widest this CPU supports)|avx512|avx2|default (plain x86-64); an ISA the CPU lacks is an error. The BLAS follows when it is loaded, once per process: OpenBLAS's core (unless OPENBLAS_CORETYPE or BRIGADE_BLAS_CORE names one) and oneDNN's maximum ISA"},
    {"BRIGADE_BLAS_CORE", "auto", "OpenBLAS kernels (when OPENBLAS_CORETYPE is unset): auto (from CPUID features)|openblas (its own detection)|a core name (SkylakeX, Haswell, Zen...)"},
    {"BRIGADE_GEMM", "auto", "CPU GEMM library: auto (oneDNN's sgemm, when libdnnl.so.2 is installed and usable, for A B, A B^T and A^T B with m <= n on AVX-512 CPUs, for every GEMM on AVX2 CPUs (or under BRIGADE_CPU_ISA=avx2) and when OpenBLAS's kernels are narrower than the CPU; OpenBLAS for the rest)|openblas|onednn (every layout; fails when oneDNN cannot be loaded)"},
    {"BRIGADE_GEMM_TRANSPOSE", "auto", "CPU GEMMs C = A B^T and A^T B: copy the transposed operand (per tile, or once where tiles share it, into the backend's scratch) and run C = A B: auto (where it measured faster, when m, n and k are all >= 256 and oneDNN runs the layout: A B^T and A^T B under AVX2 (or BRIGADE_CPU_ISA=avx2), A B^T under AVX-512; docs/kernels.md)|on (A B^T and A^T B, every shape)|off"},
    {"BRIGADE_TIMEOUT", "60", "seconds before a pending operation on a silent peer fails"},
    {"BRIGADE_HEARTBEAT_MS", "200", "liveness heartbeat period in milliseconds"},
    {"BRIGADE_RANK", "", "this process's rank in the job"},
    {"BRIGADE_WORLD_SIZE", "", "number of processes in the job"},
    {"BRIGADE_LOCAL_RANK", "", "rank among the processes on this machine"},
    {"BRIGADE_MASTER_ADDR", "127.0.0.1", "address of rank 0's rendezvous store"},
    {"BRIGADE_MASTER_PORT", "29500", "port of rank 0's rendezvous store"},
    {"BRIGADE_JOB_TOKEN", "", "shared secret every store client must present"},
    {"BRIGADE_UCX_TLS", "", "UCX transports to use (passed as UCX_TLS when set)"},
    {"BRIGADE_UCX_RNDV_THRESH", "256K", "UCX rendezvous threshold (UCX_RNDV_THRESH wins when set; \"auto\" for multi-node InfiniBand)"},
    {"BRIGADE_ALLREDUCE_SMALL_BYTES", "65536", "allreduce: at most this many bytes use recursive doubling, more use the ring"},
    {"BRIGADE_BUCKET_MB", "4", "data-parallel gradient bucket size in MiB (reduction starts per bucket)"},
    {"BRIGADE_ZERO_BUFFERS", "3", "--zero 2: gradient bucket buffers per stage (one written, the others being reduced), 2..16: more overlap, more memory (fewer when they would outweigh the shard's saving)"},
    {"BRIGADE_ZERO_PREFETCH", "1", "--zero 3: buckets whose parameters are gathered ahead of the one computing, 0..15 (each a gather buffer of the largest bucket: fewer when they would outweigh the shard's saving; 0 waits for every gather)"},
    {"BRIGADE_STAGING", "auto", "transfers of backend buffers between ranks: auto (device buffers: handed to UCX where it reads CUDA memory, else staged through host memory)|always (every buffer staged: tests the staged path on the CPU)|direct (sends and receives on the buffers themselves behind the backend's events, reductions staged: tests that path on the CPU)"},
    {"BRIGADE_COLL", "auto", "provider of the group collectives on backend buffers (tensor group, ZeRO, data parallelism; runtime/devcoll.h): auto (host buffers: the transport in place; device buffers: staged through host memory, or gathers on the device buffer where UCX reads CUDA memory)|nccl (a cuda backend: NCCL, loaded with dlopen, queued on the compute stream; one GPU per rank; an error where it cannot run)"},
    {"BRIGADE_STAGE_CHUNK_KB", "4096", "staged point-to-point transfers: KiB per chunk (the device copy of one chunk overlaps the sending of the previous)"},
    {"BRIGADE_NUMA", "auto", "bind memory and threads to the local NUMA node: auto|on|off"},
    {"BRIGADE_TP_OVERLAP", "weight", "tensor parallelism, fused backward (GPipe, 1F1B, interleaved; the zero-bubble schedules and DualPipe split B and W): weight (a column-parallel or vocabulary-parallel head layer's input-gradient sum runs while the layer's weight gradient computes)|layer (it is waited for inside the layer, overlapping the layer's second half of rows only, as under split B and W)|microbatch (weight, and each compute instruction runs beside the next when one is a forward and the other a backward of another microbatch, as two coroutines on the rank's thread: one microbatch's group sums, and under --ep its all-to-alls, run while the other computes; bitwise the same steps; not with --zero, --ps or --emulate; one more scratch per stage and the two instructions' buffers at once, which brigade plan counts when this is set and tp > 1)"},
    {"BRIGADE_CP_OVERLAP", "on", "context parallelism, the attention backward's ring: on (each block's dK/dV accumulator travels to the next member while the next block's gradient is computed, then the two are added: bitwise the serial order's sums)|off (the serial order: each hop waited for before the next block computes)"},
    {"BRIGADE_GUARD", "auto", "guard zones after every buffer a stage hands a layer, checked after each layer call: a layer writing past its reported sizes fails naming the layer and buffer (poisoned under ASan): auto|on|off|canary; canary: only each zone's first 8 bytes, on host backends (the zones are counted by the memory model either way); auto = on in ASan and Debug builds, canary otherwise"},
    {"BRIGADE_FUSE", "on", "fuse a linear layer's bias with a following GELU inside a block (forward and backward: one pass each instead of two, the same bits): on|off"},
    {"BRIGADE_OFFLOAD_PREFETCH", "on", "--offload optimizer --offload-dir: read the state ahead (madvise) when the last microbatch's backward of a stage begins, so the disk reads overlap the backward: on|off (off: the optimizer step faults the pages in; to measure the overlap)"},
    {"BRIGADE_OFFLOAD_ACT_AHEAD", "0", "--offload activations: a microbatch's stash comes back from host memory this many compute instructions before its first backward piece (0: in that piece itself; the copies block, so more only holds the stash longer), 0..1000; a stash whose backward is nearer is not offloaded"},
    {"BRIGADE_OFFLOAD_EVICT", "off", "--offload optimizer --offload-dir, benchmarks only: at each step's start the state's pages are written back and dropped from memory (msync, MADV_PAGEOUT), as on a machine short of memory, so the step reads them from disk: on|off"},
    {"BRIGADE_OFFLOAD_STEP", "auto", "--offload optimizer: where the optimizer step runs: auto (the backend's kernel on the offloaded state where the backend's buffers are host memory; on a device backend the host-held step: parameters and gradients copied to pinned host memory, the CPU's AdamW there, the parameters copied back; with --offload optimizer,params the shard stays in host memory, stepped in place, uploaded by each gather)|host (the host-held step on every backend: tests it on cpu-async)"},
    {"BRIGADE_DEVICE_CHECK", "off", "testing only, the cpu-async backend: on: it stands in for a device faithfully: it reports device buffers (every device-only path is taken: staging, the host-held optimizer step) and its copies to and from the host (the device side), copies, fills, scale, axpy, sums and optimizer kernels refuse a pointer outside its own live allocations, skipping the op and failing the run with a device fault that names the op and the pointer: on|off"},
    {"BRIGADE_FAULT_CKPT_VIA_BACKEND", "off", "testing only: on: a checkpoint's save reads optimizer state that a store holds in host memory (--offload optimizer) through the backend's copies, as if it were the backend's memory (on a device backend a fault BRIGADE_DEVICE_CHECK=on must catch): on|off"},
    {"BRIGADE_FAULT_UPLOAD_NOWAIT", "off", "testing only: on: --offload params on a device backend gathers a layer without the compute stream waiting for the upload of its parameter shard (a wrong result the tests must catch): on|off"},
    {"BRIGADE_FAULT_WRITE_BYTES", "", "testing only: bytes this process may write to weights and checkpoint files before every further write fails as on a full disk (unset: off)"},
    {"BRIGADE_RESTART_COUNT", "0", "set by brigade launch --max-restarts: how many times the job was restarted (0 on the first attempt)"},
};

const char *bg_version(void)
{
    return BRIGADE_VERSION_STRING;
}

const bg_config_var_t *bg_config_table(size_t *count_p)
{
    *count_p = sizeof(bg__config) / sizeof(bg__config[0]);
    return bg__config;
}

static const bg_config_var_t *bg__find(const char *name)
{
    for (size_t i = 0; i < sizeof(bg__config) / sizeof(bg__config[0]); i++)
        if (strcmp(bg__config[i].name, name) == 0)
            return &bg__config[i];
    return NULL;
}

const char *bg_config_str(const char *name)
{
    const bg_config_var_t *v = bg__find(name);
    if (!v)
        return NULL;
    const char *e = getenv(name);
    return (e && *e) ? e : v->dflt;
}

/* Parses a declared, set variable as an integer (into *i_p) or, with i_p
 * NULL, as a double (into *d_p): one path for both typed getters, so they
 * report undeclared, unset and malformed values alike. */
static bg_status_t bg__config_number(const char *name, long long *i_p, double *d_p)
{
    const char *s = bg_config_str(name);
    if (!s)
        return bg_error(BG_ERR_INTERNAL, "configuration variable %s is not declared", name);
    if (!*s)
        return bg_error(BG_ERR_NOT_FOUND, "%s is not set", name);
    char *end;
    errno = 0;
    long long i = 0;
    double d = 0;
    if (i_p)
        i = strtoll(s, &end, 10);
    else
        d = strtod(s, &end);
    if (errno || *end)
        return bg_error(BG_ERR_INVALID, "%s=\"%s\" is not %s", name, s, i_p ? "an integer" : "a number");
    if (i_p)
        *i_p = i;
    else
        *d_p = d;
    return BG_OK;
}

bg_status_t bg_config_int(const char *name, long long *value_p)
{
    return bg__config_number(name, value_p, NULL);
}

bg_status_t bg_config_double(const char *name, double *value_p)
{
    return bg__config_number(name, NULL, value_p);
}

bg_status_t bg_config_on(const char *name, int *on_p)
{
    const char *v = bg_config_str(name);
    if (!v)
        return bg_error(BG_ERR_INTERNAL, "configuration variable %s is not declared", name);
    if (strcmp(v, "on") && strcmp(v, "off"))
        return bg_error(BG_ERR_INVALID, "%s=%s: expected on or off", name, v);
    *on_p = !strcmp(v, "on");
    return BG_OK;
}

