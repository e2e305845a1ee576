#!/usr/bin/env python3
"""bench/gemm_mkl.py: the GPT's GEMM shapes through PyTorch's MKL and brigade's oneDNN, in one process.

Each shape runs MKL (torch.mm / addmm_) and oneDNN's dnnl_sgemm (libdnnl.so.2 through ctypes, the
library brigade's CPU backend picks under AVX2) alternately, 30 rounds, best time, one thread, and
prints GFLOP/s and the ratio of the summed times. The ISA is whatever the environment forces: e.g.
  ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1 \
      python bench/gemm_mkl.py [cold]
"cold" adds 8 MB of writes before each call (the step's caches are not warm). Not in CI.
"""
import ctypes
import sys
import time

import torch

torch.set_num_threads(1)
dn = ctypes.CDLL("libdnnl.so.2").dnnl_sgemm
dn.argtypes = [ctypes.c_char, ctypes.c_char] + [ctypes.c_int64] * 3 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int64,
                                                                         ctypes.c_void_p, ctypes.c_int64, ctypes.c_float,
                                                                         ctypes.c_void_p, ctypes.c_int64]
# (A transposed, B transposed, m, n, k): the 2-block GPT step's shapes (brigade bench kernels --sizes 512)
SHAPES = [(0, 1, 256, 768, 256), (0, 1, 256, 256, 256), (0, 1, 256, 1024, 256), (0, 1, 256, 256, 1024),
          (0, 0, 256, 256, 256), (1, 0, 256, 256, 256), (0, 0, 256, 1024, 256), (1, 0, 256, 1024, 256),
          (0, 0, 256, 256, 1024), (1, 0, 1024, 256, 256), (0, 0, 256, 256, 768), (1, 0, 768, 256, 256)]
cold = len(sys.argv) > 1 and sys.argv[1] == "cold"
flush = torch.zeros(2 << 20)
tot = [0.0, 0.0]
print("layout     m     n     k   MKL GFLOP/s  oneDNN GFLOP/s")
for ta, tb, m, n, k in SHAPES:
    A = torch.randn(k, m) if ta else torch.randn(m, k)
    B = torch.randn(n, k) if tb else torch.randn(k, n)
    a, b = (A.t() if ta else A), (B.t() if tb else B)
    C, C2 = torch.zeros(m, n), torch.zeros(m, n)
    best = [1e9, 1e9]
    for _ in range(30):
        for lib in (0, 1):
            if cold:
                flush.add_(1.0)
            t0 = time.perf_counter()
            if lib == 0:
                C.addmm_(a, b) if ta else torch.mm(a, b, out=C)
            else:
                dn(b"T" if ta else b"N", b"T" if tb else b"N", m, n, k, 1.0, A.data_ptr(), m if ta else k,
                   B.data_ptr(), k if tb else n, 1.0 if ta else 0.0, C2.data_ptr(), n)
            best[lib] = min(best[lib], time.perf_counter() - t0)
    tot = [tot[0] + best[0], tot[1] + best[1]]
    f = 2.0 * m * n * k
    print(f"{'T' if ta else 'N'}{'T' if tb else 'N'}     {m:5d} {n:5d} {k:5d} {f / best[0] / 1e9:13.1f} {f / best[1] / 1e9:15.1f}")
print(f"summed times, oneDNN / MKL: {tot[1] / tot[0]:.3f}")
