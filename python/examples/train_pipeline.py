#!/usr/bin/env python3
"""Train a small transformer from brigade's built-in layers on a synthetic
token task, on a pipeline of --pp ranks (x --dp replicas).

    build/brigade launch -n 2 -- python3 python/examples/train_pipeline.py --pp 2 --steps 20 --save DIR
    python3 python/examples/train_pipeline.py --pp 1 --steps 20 --save DIR1   # one process, same weights

Rank and world come from the environment (brigade launch, torchrun, ...), as
for any brigade program. The task: each sequence counts up by a step of 1, 2
or 3 (mod vocab) from a random start; the model predicts the next token, so
it has to read the step off the tokens before (attention). The data is a pure
function of (data seed, step, sequence index), so every layout sees the same
batches and the pipelined weights equal the one-process weights bitwise.
"""
import argparse
import random
import sys

try:
    import numpy as np
except ImportError:
    np = None

import brigade as bg


def build_model(a):
    m = bg.Model(name="py-gpt", input="tokens", vocab=a.vocab, seq_len=a.seq, seed=a.seed)
    m.add(bg.Embedding("embed", a.vocab, a.seq, a.d_model))
    proj_std = 0.02 / (2.0 * a.layers) ** 0.5
    for i in range(a.layers):
        m.add(bg.TransformerBlock("blocks.%d" % i, a.d_model, a.heads, 0.02, proj_std))
    m.add(bg.LayerNorm("ln_f", a.d_model))
    m.add(bg.Head("head", a.d_model, a.vocab, bias=False))
    if a.tie:
        m.tie("embed.wte", "head.weight")
    return m.check()


def sequence(data_seed, step, index, t, vocab):
    """Tokens (t + 1 of them) of sequence `index` of step `step`'s global batch."""
    r = random.Random((data_seed * 1000003 + step) * 1000003 + index)
    start, stride = r.randrange(vocab), r.choice((1, 2, 3))
    return [(start + stride * i) % vocab for i in range(t + 1)]


def make_batches(a):
    def batches(rq):
        seqs = [sequence(a.data_seed, rq.step, rq.first + i, rq.t, a.vocab) for i in range(rq.n)]
        inputs = [s[:-1] for s in seqs]
        targets = [s[1:] for s in seqs]
        if np is not None and not a.no_numpy:
            return np.array(inputs, dtype=np.int32), np.array(targets, dtype=np.int32)
        return inputs, targets
    return batches


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pp", type=int, default=1, help="pipeline ranks")
    ap.add_argument("--dp", type=int, default=1, help="data-parallel replicas")
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--layers", type=int, default=2, help="transformer blocks")
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1337, help="initialisation seed")
    ap.add_argument("--data-seed", type=int, default=7)
    ap.add_argument("--tie", action="store_true", help="tie head.weight to embed.wte")
    ap.add_argument("--threads", type=int, default=0, help="compute threads (0: all)")
    ap.add_argument("--no-numpy", action="store_true", help="feed plain Python lists")
    ap.add_argument("--save", help="write the final weights here")
    a = ap.parse_args()

    model = build_model(a)
    with bg.Executor(model, batches=make_batches(a), pp=a.pp, dp=a.dp, schedule=a.schedule, batch=a.batch,
                     microbatches=a.microbatches, lr=a.lr, weight_decay=0.1, threads=a.threads) as ex:
        if ex.rank == 0:
            info = ex.info()
            print("model %s: %d layers, %d parameters; %d ranks, %d stages (%s), rank 0 holds %d"
                  % (model.name, len(model), model.param_count, info.world, info.stages, info.schedule, info.params))
        first = None
        for s in range(a.steps):
            ex.set_lr(a.lr * min(1.0, (s + 1) / 5))  # the host's schedule: a short warm-up
            r = ex.step()
            first = r.loss if first is None else first
            if ex.rank == 0:
                print("step %d loss %.4f (%.1f ms)" % (r.step, r.loss, r.step_ms), flush=True)
        if a.save:
            ex.save_weights(a.save)
        if ex.rank == 0:
            print("loss %.4f -> %.4f" % (first, r.loss))
    return 0


if __name__ == "__main__":
    sys.exit(main())
