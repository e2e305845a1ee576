/* bench/cublas_gemm.c: cuBLAS GEMM throughput on one GPU, the ceiling the
 * CUDA backend's GEMMs can reach: square n x n x n products in fp32
 * (cublasGemmEx, CUBLAS_COMPUTE_32F), TF32 tensor cores (fp32 data,
 * CUBLAS_COMPUTE_32F_FAST_TF32) and bf16 tensor cores (bf16 A and B, fp32 C,
 * fp32 accumulation). Median of --repeat timed runs (CUDA events) after one
 * warm-up. Plain C on the CUDA runtime and cuBLAS (no nvcc); built when the
 * CUDA backend is. Exit 77 with the reason when no device is present.
 *
 *   cublas_gemm [n ...]     default 4096 8192 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call, what)                                                                  \
    do {                                                                                \
        if ((call) != 0) {                                                              \
            fprintf(stderr, "cublas_gemm: %s failed\n", what);                          \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

static int cmp(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* one configuration: median milliseconds of 7 runs into *ms */
static int run(cublasHandle_t h, int n, cudaDataType_t ab, cublasComputeType_t ct, void *a, void *b, float *c,
               float *ms)
{
    const float alpha = 1.0f, beta = 0.0f;
    float t[7];
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0), "cudaEventCreate");
    CK(cudaEventCreate(&e1), "cudaEventCreate");
    for (int r = -1; r < 7; r++) {
        CK(cudaEventRecord(e0, 0), "cudaEventRecord");
        CK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, ab, n, b, ab, n, &beta, c, CUDA_R_32F, n, ct,
                        CUBLAS_GEMM_DEFAULT),
           "cublasGemmEx");
        CK(cudaEventRecord(e1, 0), "cudaEventRecord");
        CK(cudaEventSynchronize(e1), "cudaEventSynchronize");
        if (r >= 0)
            CK(cudaEventElapsedTime(&t[r], e0, e1), "cudaEventElapsedTime");
    }
    qsort(t, 7, sizeof(float), cmp);
    *ms = t[3];
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 0;
}

int main(int argc, char **argv)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        printf("SKIP: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    int sizes[16], ns = 0;
    for (int i = 1; i < argc && ns < 16; i++)
        sizes[ns++] = atoi(argv[i]);
    if (!ns) {
        sizes[ns++] = 4096;
        sizes[ns++] = 8192;
    }
    cublasHandle_t h;
    CK(cublasCreate(&h), "cublasCreate");
    printf("device: %s (sm_%d%d)\n%-6s %-6s %10s %10s\n", prop.name, prop.major, prop.minor, "n", "math", "ms",
           "TFLOP/s");
    for (int si = 0; si < ns; si++) {
        int n = sizes[si];
        size_t el = (size_t)n * n;
        void *a, *b;
        float *c;
        CK(cudaMalloc(&a, el * 4), "cudaMalloc");
        CK(cudaMalloc(&b, el * 4), "cudaMalloc");
        CK(cudaMalloc((void **)&c, el * 4), "cudaMalloc");
        /* random operands: tensor cores draw less power on zeros and would be timed faster than on real data.
         * The bf16 runs read the same bytes as pairs of bf16: bit 14 of each float is cleared so that the low
         * half's exponent is never all ones (no infinities or NaNs there either). */
        uint32_t *host = malloc(el * 4);
        if (!host) {
            fprintf(stderr, "out of host memory\n");
            return 1;
        }
        srand(1234);
        for (int op = 0; op < 2; op++) {
            for (size_t i = 0; i < el; i++) {
                float f = (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
                memcpy(&host[i], &f, 4);
                host[i] &= ~0x4000u;
            }
            CK(cudaMemcpy(op ? b : a, host, el * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
        }
        free(host);
        static const struct {
            const char *name;
            cudaDataType_t ab;
            cublasComputeType_t ct;
        } modes[] = {{"fp32", CUDA_R_32F, CUBLAS_COMPUTE_32F},
                     {"tf32", CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32},
                     {"bf16", CUDA_R_16BF, CUBLAS_COMPUTE_32F}};
        for (int m = 0; m < 3; m++) {
            float ms;
            if (run(h, n, modes[m].ab, modes[m].ct, a, b, c, &ms) != 0)
                return 1;
            printf("%-6d %-6s %10.3f %10.1f\n", n, modes[m].name, ms, 2.0 * n * (double)n * n / (ms * 1e-3) / 1e12);
        }
        cudaFree(a);
        cudaFree(b);
        cudaFree(c);
    }
    cublasDestroy(h);
    return 0;
}
