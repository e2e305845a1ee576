#!/usr/bin/env python3
"""bench/compare_torch.py: the GPT `brigade train --model gpt` builds, trained by
PyTorch eager on the CPU, for bench/compare_torch.sh (not in CI).

Same model as models/builders.c: token + position embeddings, N pre-LN blocks
(LayerNorm, qkv Linear with bias, causal attention, proj Linear with bias, residual;
LayerNorm, fc Linear 4C with bias, tanh GELU, proj Linear with bias, residual), a final
LayerNorm and an untied head without bias; fp32, AdamW (weight decay 0, as brigade's
default), mean cross-entropy. Attention is F.scaled_dot_product_attention(is_causal=True)
(PyTorch's fused CPU kernel). Bytes of a text file are the tokens (vocab 256).

Modes (each process uses --threads intra-op threads):
  one  one process, gradient accumulation over the microbatches
  pp   2 processes, torch.distributed.pipelining Schedule1F1B on gloo, split after
       block layers//2 - 1 (the embedding and the first half of the blocks on stage 0:
       brigade's --split 5,6 for 8 blocks)
  dp   2 processes, DistributedDataParallel on gloo, each replica batch/2 sequences in
       microbatches/2 microbatches (no_sync on all but the last)
Prints "parameters N" and "median step X ms, Y tokens/s" (the median over steps after
the first two, like brigade train's summary of its median step).
"""
import argparse
import math
import os
import socket
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, heads, std, proj_std):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(c, eps=1e-5)
        self.qkv = nn.Linear(c, 3 * c)
        self.attn_proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c, eps=1e-5)
        self.fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)
        for lin, s in ((self.qkv, std), (self.attn_proj, proj_std), (self.fc, std), (self.mlp_proj, proj_std)):
            nn.init.normal_(lin.weight, std=s)
            nn.init.zeros_(lin.bias)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Embed(nn.Module):
    def __init__(self, vocab, seq, c, std):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(seq, c)
        nn.init.normal_(self.wte.weight, std=std)
        nn.init.normal_(self.wpe.weight, std=std)

    def forward(self, tok):
        return self.wte(tok) + self.wpe(torch.arange(tok.shape[1], device=tok.device))


class Head(nn.Module):
    def __init__(self, c, vocab, std):
        super().__init__()
        self.ln_f = nn.LayerNorm(c, eps=1e-5)
        self.head = nn.Linear(c, vocab, bias=False)
        nn.init.normal_(self.head.weight, std=std)

    def forward(self, x):
        return self.head(self.ln_f(x))


def build(a):
    """The model as a list of parts: embed, blocks..., head (ln_f + head)."""
    std, proj_std = 0.02, 0.02 / math.sqrt(2.0 * a.layers)
    return ([Embed(a.vocab, a.seq, a.d_model, std)] +
            [Block(a.d_model, a.heads, std, proj_std) for _ in range(a.layers)] +
            [Head(a.d_model, a.vocab, std)])


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Data:
    """Random windows of seq+1 bytes of a file (or random bytes without one)."""

    def __init__(self, path, seq, seed):
        self.seq = seq
        self.g = torch.Generator().manual_seed(seed)
        if path and os.path.exists(path):
            with open(path, "rb") as f:
                self.buf = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
        else:
            self.buf = torch.randint(0, 256, (1 << 20,), generator=self.g)

    def batch(self, n):
        i = torch.randint(0, len(self.buf) - self.seq - 1, (n,), generator=self.g)
        w = torch.stack([self.buf[j:j + self.seq + 1] for j in i.tolist()])
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def report(a, times, nparams):
    t = statistics.median(times[2:] if len(times) > 2 else times)
    print(f"parameters {nparams}")
    print(f"median step {t * 1e3:.1f} ms, {a.batch * a.seq / t:.0f} tokens/s", flush=True)


def run_one(a):
    torch.manual_seed(a.seed)
    model = nn.Sequential(*build(a))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    data, mb = Data(a.data, a.seq, a.seed), a.batch // a.microbatches
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        for _ in range(a.microbatches):
            x, y = data.batch(mb)
            (loss_fn(model(x), y) / a.microbatches).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    report(a, times, sum(p.numel() for p in model.parameters()))


def worker(rank, a, port):
    import torch.distributed as dist
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(a.seed)
    parts = build(a)
    nparams = sum(p.numel() for m in parts for p in m.parameters())
    data = Data(a.data, a.seq, a.seed + (rank if a.mode == "dp" else 0))
    times = []
    if a.mode == "dp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(nn.Sequential(*parts))
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
        m, mb = a.microbatches // 2, a.batch // a.microbatches
        for _ in range(a.steps):
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            for i in range(m):
                x, y = data.batch(mb)
                if i < m - 1:
                    with model.no_sync():
                        (loss_fn(model(x), y) / m).backward()
                else:
                    (loss_fn(model(x), y) / m).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
    else:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B
        cut = 1 + a.layers // 2
        mod = nn.Sequential(*(parts[:cut] if rank == 0 else parts[cut:]))
        stage = PipelineStage(mod, rank, 2, torch.device("cpu"))
        sched = Schedule1F1B(stage, a.microbatches, loss_fn=loss_fn)
        opt = torch.optim.AdamW(mod.parameters(), lr=a.lr, weight_decay=0.0)
        for _ in range(a.steps):
            x, y = data.batch(a.batch)  # both ranks draw the same batch (same seed)
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            if rank == 0:
                sched.step(x)
            else:
                sched.step(target=y, losses=[])
            opt.step()
            times.append(time.perf_counter() - t0)
    if rank == 0:
        report(a, times, nparams)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["one", "pp", "dp"], default="one")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--microbatches", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--data", default="")
    a = p.parse_args()
    if a.batch % a.microbatches or (a.mode != "one" and a.microbatches % 2):
        sys.exit(f"compare_torch.py: batch {a.batch} must split into {a.microbatches} microbatches "
                 "(an even number for pp/dp)")
    torch.set_num_threads(a.threads)
    if a.mode == "one":
        run_one(a)
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        import torch.multiprocessing as mp
        mp.spawn(worker, args=(a, port), nprocs=2, join=True)


if __name__ == "__main__":
    main()
