#!/usr/bin/env python3
"""A GPT written as PyTorch modules (its own: embedding, blocks, a final
layernorm + head + cross-entropy), trained by brigade as pipeline stages
(brigade.torch.Module per top-level module), or, with --reference, by
PyTorch alone on one process with torch.optim.AdamW on the same batches.

    brigade launch -n 2 -- python3 python/examples/torch_gpt.py --pp 2 --schedule zb-h1 --dump DIR
    brigade launch -n 2 -- python3 python/examples/torch_gpt.py --pp 2 --schedule zbv --dump DIR
    python3 python/examples/torch_gpt.py --reference --dump REF    # the same training in PyTorch

--dump DIR writes each rank's tensors to DIR/rankR.npz (the reference: one
file), by brigade's tensor names, for comparing the two. Needs torch.
"""
import argparse
import os
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Embed(nn.Module):
    def __init__(self, vocab, seq, c):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(seq, c)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.02)

    def forward(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        # no qkv bias: the key bias's gradient is zero analytically (a constant added to every key shifts
        # a query's scores alike), so it is rounding noise that AdamW turns into lr-sized steps, and two
        # implementations (or microbatchings) of the same model drift apart on it alone
        self.qkv, self.proj = nn.Linear(c, 3 * c, bias=False), nn.Linear(c, c)
        self.fc, self.out = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        n, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(n, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(n, t, c)
        x = x + self.proj(a)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class LossHead(nn.Module):
    """Final layernorm, head, per-position cross-entropy: (n, t, c), (n, t) -> (n, t)."""

    def __init__(self, c, vocab):
        super().__init__()
        self.ln, self.head = nn.LayerNorm(c), nn.Linear(c, vocab, bias=False)

    def forward(self, x, targets):
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               reduction="none").view(targets.shape)


def modules(a):
    """[(brigade layer name, module)] from the seed: the same weights in every process."""
    torch.manual_seed(a.seed)
    out = [("embed", Embed(a.vocab, a.seq, a.d_model))]
    out += [("blocks.%d" % i, Block(a.d_model, a.heads)) for i in range(a.layers)]
    return out + [("head", LossHead(a.d_model, a.vocab))]


def sequence(data_seed, step, index, t, vocab):
    r = random.Random((data_seed * 1000003 + step) * 1000003 + index)
    start, stride = r.randrange(vocab), r.choice((1, 2, 3))
    return [(start + stride * i) % vocab for i in range(t + 1)]


def batch(a, step, first, n):
    s = np.array([sequence(a.data_seed, step, first + i, a.seq, a.vocab) for i in range(n)], dtype=np.int32)
    return s[:, :-1], s[:, 1:]


def reference(a):
    mods = modules(a)
    params = [p for _, m in mods for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    for step in range(a.steps):
        x, y = (torch.from_numpy(v).long() for v in batch(a, step, 0, a.batch))
        for _, m in mods[:-1]:
            x = m(x)
        loss = mods[-1][1](x, y).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print("step %d loss %.6f" % (step + 1, loss.item()), flush=True)
    if a.dump:
        os.makedirs(a.dump, exist_ok=True)
        np.savez(os.path.join(a.dump, "reference.npz"),
                 **{"%s.%s" % (ln, n): p.detach().numpy() for ln, m in mods for n, p in m.named_parameters()})


def train(a):
    import brigade as bg
    import brigade.torch as bgt
    layers = [bgt.Module(ln, m, loss=(ln == "head"), classes=a.vocab) for ln, m in modules(a)]
    model = bg.Model(name="torch-gpt", input="tokens", vocab=a.vocab, seq_len=a.seq, seed=a.seed)
    for l in layers:
        model.add(l)
    model.check()

    def batches(rq):
        return batch(a, rq.step, rq.first, rq.n)

    with bg.Executor(model, batches=batches, pp=a.pp, schedule=a.schedule, chunks=a.chunks, batch=a.batch,
                     microbatches=a.microbatches, lr=a.lr, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0,
                     threads=1) as ex:
        for _ in range(a.steps):
            r = ex.step()
            if ex.rank == 0:
                print("step %d loss %.6f" % (r.step, r.loss), flush=True)
        if a.dump:
            os.makedirs(a.dump, exist_ok=True)
            np.savez(os.path.join(a.dump, "rank%d.npz" % ex.rank),
                     **{"%s.%s" % (l.name, n): np.array(v) for l in layers for n, v in l.params.items()})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", action="store_true", help="train with PyTorch alone, one process")
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--chunks", type=int, default=0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--data-seed", type=int, default=7)
    ap.add_argument("--dump", help="write the final tensors here (npz)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    reference(a) if a.reference else train(a)


if __name__ == "__main__":
    main()
