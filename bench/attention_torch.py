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

--llama B,T,G,g,HS,H times the Llama-style blocks that `brigade bench kernels --llama`
times, each forward + backward through autograd (fp32, eager): rmsnorm (F.rms_norm over
C = G g HS with a weight), swiglu (F.silu(a) * b of a (B T, 2H) input), rope (forward only,
rotate-half of the g + 1 rotated heads of each group, a precomputed cos/sin table) and
gqa_attention (G g query heads over G key/value heads, the faster by CPU time of
F.scaled_dot_product_attention(is_causal=True, enable_gqa=True) and of the same call
on K and V expanded by repeat_interleave, their gradients summed back through it;
the line names which). One line per block:
  torch llama NAME B=.. T=.. G=.. g=.. hs=.. H=..: X ms, CPU time Y ms
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


def llama_blocks(b, t, G, g, hs, H):
    """name -> a function running the block once (forward, and backward where it has one)"""
    gen = torch.Generator().manual_seed(9)
    rnd = lambda *shape: torch.rand(*shape, generator=gen).mul_(2).sub_(1)
    C = G * g * hs
    x, w, dy = rnd(b * t, C).requires_grad_(), rnd(C).requires_grad_(), rnd(b * t, C)
    u, du = rnd(b * t, 2 * H).requires_grad_(), rnd(b * t, H)
    xr = rnd(b, t, G, g + 2, hs)
    half = hs // 2
    inv = 10000.0 ** (-torch.arange(0, half, dtype=torch.float64) * 2 / hs)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = (f(ang).float()[None, :, None, None, :] for f in (torch.cos, torch.sin))
    q = rnd(b, G * g, t, hs).requires_grad_()
    k, v = rnd(b, G, t, hs).requires_grad_(), rnd(b, G, t, hs).requires_grad_()
    dq = rnd(b, G * g, t, hs)

    def rmsnorm():
        x.grad = w.grad = None
        F.rms_norm(x, (C,), w, 1e-5).backward(dy)

    def swiglu():
        u.grad = None
        a, c = u.chunk(2, dim=-1)
        (F.silu(a) * c).backward(du)

    def rope():
        r = xr[..., : g + 1, :]
        x1, x2 = r[..., :half], r[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    def gqa_attention():
        q.grad = k.grad = v.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(dq)

    def gqa_expanded():
        q.grad = k.grad = v.grad = None
        ke, ve = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        F.scaled_dot_product_attention(q, ke, ve, is_causal=True).backward(dq)

    return {"rmsnorm": rmsnorm, "swiglu": swiglu, "rope": rope, "gqa_attention": gqa_attention,
            "gqa_attention expanded": gqa_expanded}


def time_block(fn, repeat):
    wall, cpu = [], []
    for r in range(repeat + 1):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        if r:
            wall.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attention", action="append", default=[], help="B,T,NH,HS (repeatable)")
    ap.add_argument("--llama", action="append", default=[], help="B,T,G,g,HS,H (repeatable)")
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
    for shape in a.llama:
        b, t, G, g, hs, H = (int(x) for x in shape.split(","))
        times = {name: time_block(fn, a.repeat) for name, fn in llama_blocks(b, t, G, g, hs, H).items()}
        expanded = times.pop("gqa_attention expanded")
        how = "enable_gqa"
        if expanded[1] < times["gqa_attention"][1]:
            times["gqa_attention"], how = expanded, "expanded K/V"
        for name, (w, c) in times.items():
            note = f" ({how})" if name == "gqa_attention" else ""
            print(f"  torch llama {name} B={b} T={t} G={G} g={g} hs={hs} H={H}: {w:.3f} ms, CPU time {c:.3f} ms"
                  f"{note}", flush=True)


if __name__ == "__main__":
    main()
