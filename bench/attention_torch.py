#!/usr/bin/env python3
"""bench/attention_torch.py: PyTorch's fused causal attention on the CPU, forward and
backward, timed like `brigade bench kernels --attention` (bench/attention_isa.sh runs
both; not in CI).

F.scaled_dot_product_attention(q, k, v, is_causal=True) on fp32 (B, NH, T, HS)
tensors that require gradients, then .backward() of the output against a fixed
gradient; one intra-op thread unless --threads says otherwise. The ISA is the
environment's: ATEN_CPU_CAPABILITY (default|avx2|avx512) and MKL_ENABLE_INSTRUCTIONS
must be set before Python starts. Prints one line per shape:
  torch attention B=.. T=.. NH=.. hs=..: fwd+bwd X ms (backward Y); CPU time Z ms (backward W); capability C
with the medians of --repeat runs after one warm-up (wall time, and the process's CPU
time: on a shared machine the second leaves out the time other processes held the core).
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def bench(b, t, nh, hs, repeat):
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.rand(b, nh, t, hs, generator=g).mul_(2).sub_(1).requires_grad_() for _ in range(3))
    dy = torch.rand(b, nh, t, hs, generator=g).mul_(2).sub_(1)
    wall, cpu = [], []
    for r in range(repeat + 1):
        q.grad = k.grad = v.grad = None
        w0, c0 = time.perf_counter(), time.process_time()
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        w1, c1 = time.perf_counter(), time.process_time()
        y.backward(dy)
        w2, c2 = time.perf_counter(), time.process_time()
        if r:
            wall.append((w2 - w0, w2 - w1))
            cpu.append((c2 - c0, c2 - c1))
    med = lambda xs, i: statistics.median(x[i] for x in xs) * 1e3
    return med(wall, 0), med(wall, 1), med(cpu, 0), med(cpu, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attention", action="append", required=True, help="B,T,NH,HS (repeatable)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cap = torch.backends.cpu.get_cpu_capability()
    for shape in a.attention:
        b, t, nh, hs = (int(x) for x in shape.split(","))
        fb, bw, cfb, cbw = bench(b, t, nh, hs, a.repeat)
        print(f"  torch attention B={b} T={t} NH={nh} hs={hs}: fwd+bwd {fb:.3f} ms (backward {bw:.3f}); "
              f"CPU time {cfb:.3f} ms (backward {cbw:.3f}); capability {cap}, torch {torch.__version__}",
              flush=True)


if __name__ == "__main__":
    main()
