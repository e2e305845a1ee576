#!/usr/bin/env python3
"""Train an MLP whose layers are written in Python with numpy (a linear, a
tanh and a softmax cross-entropy loss, each a brigade.Layer subclass) on a
synthetic classification task, on a pipeline of --pp ranks (x --dp, x --tp:
column- and row-parallel pairs of linears over a tensor group).

    python3 python/examples/numpy_mlp.py --steps 20 --save DIR1                  # one process
    brigade launch -n 2 -- python3 python/examples/numpy_mlp.py --pp 2 --schedule zb-h1 --save DIR2
    brigade compare DIR1 DIR2                                                    # bitwise identical

brigade owns every buffer: the layers get numpy views of its activations,
parameters and gradients, so its schedules, optimizer, checkpoints, dp and
ZeRO work on them as on its own layers. The data is a pure function of
(data seed, step, sample index): every layout sees the same batches.
"""
import argparse

import numpy as np

import brigade as bg


class Linear(bg.Layer):
    """y = x W^T + b: (n, t, c_in) -> (n, t, c_out)."""

    def __init__(self, name, c_in, c_out, std=None):
        super().__init__(name, [bg.Param("weight", (c_out, c_in), std=std or c_in ** -0.5),
                                bg.Param("bias", (c_out,), init="const", value=0.0)])
        self.c_in, self.c_out = c_in, c_out

    def out_shape(self, shape):
        n, t, c = shape
        if c != self.c_in:
            raise ValueError("%s: input has %d channels, expected %d" % (self.name, c, self.c_in))
        return (n, t, self.c_out)

    def flops(self, shape):
        f = 2.0 * shape[0] * shape[1] * self.c_in * self.c_out
        return (f, 2 * f)

    def forward(self, ctx, x, y):
        w, b = self.params["weight"], self.params["bias"]
        np.matmul(x.reshape(-1, self.c_in), w.T, out=y.reshape(-1, self.c_out))
        y += b

    def backward_input(self, ctx, x, y, dy, dx):
        if dx is not None:  # None on a model's first layer
            np.matmul(dy.reshape(-1, self.c_out), self.params["weight"], out=dx.reshape(-1, self.c_in))

    def backward_weight(self, ctx, x, y, dy):
        dy2 = dy.reshape(-1, self.c_out)
        self.grads["weight"] += dy2.T @ x.reshape(-1, self.c_in)
        self.grads["bias"] += dy2.sum(axis=0)


class ColumnLinear(Linear):
    """Column-parallel y = x W^T + b over a tensor group of `tp`: each member
    holds rows [r c_out/tp, (r+1) c_out/tp) of W and b (Param split on dim 0)
    and outputs those channels, (n, t, c_in) -> (n, t, c_out/tp); the input's
    gradient is the sum of the members' parts (an allreduce)."""

    def __init__(self, name, c_in, c_out, tp, std=None):
        if c_out % tp:
            raise ValueError("%s: %d output features are not divisible by tp %d" % (name, c_out, tp))
        bg.Layer.__init__(self, name, [bg.Param("weight", (c_out // tp, c_in), std=std or c_in ** -0.5, split=(0, tp)),
                                       bg.Param("bias", (c_out // tp,), init="const", value=0.0, split=(0, tp))])
        self.c_in, self.c_out = c_in, c_out // tp

    def backward_input(self, ctx, x, y, dy, dx):
        super().backward_input(ctx, x, y, dy, dx)
        if dx is not None and ctx.tp is not None:
            ctx.tp.allreduce(dx)


class RowLinear(Linear):
    """Row-parallel y = x W^T + b over a tensor group of `tp`: each member
    holds columns [r c_in/tp, (r+1) c_in/tp) of W (Param split on dim 1) and
    reads those input channels (a ColumnLinear's output), (n, t, c_in/tp) ->
    (n, t, c_out); the output is the sum of the members' parts (an allreduce),
    then the bias (replicated, so its gradient is the same on every member)."""

    def __init__(self, name, c_in, c_out, tp, std=None):
        if c_in % tp:
            raise ValueError("%s: %d input features are not divisible by tp %d" % (name, c_in, tp))
        bg.Layer.__init__(self, name, [bg.Param("weight", (c_out, c_in // tp), std=std or c_in ** -0.5, split=(1, tp)),
                                       bg.Param("bias", (c_out,), init="const", value=0.0)])
        self.c_in, self.c_out = c_in // tp, c_out

    def forward(self, ctx, x, y):
        np.matmul(x.reshape(-1, self.c_in), self.params["weight"].T, out=y.reshape(-1, self.c_out))
        if ctx.tp is not None:
            ctx.tp.allreduce(y)
        y += self.params["bias"]


class Tanh(bg.Layer):
    """y = tanh(x); no parameters, nothing stashed (backward reads y)."""

    def __init__(self, name):
        super().__init__(name)

    def forward(self, ctx, x, y):
        np.tanh(x, out=y)

    def backward_input(self, ctx, x, y, dy, dx):
        if dx is not None:
            np.multiply(dy, 1.0 - y * y, out=dx)


class SoftmaxCE(bg.Layer):
    """Softmax cross-entropy against ctx.targets: (n, t, classes) logits ->
    (n, t, 1) per-position losses (the loss layer a model ends with). It keeps
    the probabilities in its stash from forward to backward."""

    def __init__(self, name, classes):
        super().__init__(name)
        self.classes = classes

    def out_shape(self, shape):
        n, t, c = shape
        if c != self.classes:
            raise ValueError("%s: input has %d channels, expected %d classes" % (self.name, c, self.classes))
        return (n, t, 1)

    def stash_bytes(self, shape):
        return shape[0] * shape[1] * self.classes * 4

    def forward(self, ctx, x, y):
        z = x.reshape(-1, self.classes)
        p = ctx.stash.view(np.float32).reshape(z.shape)
        np.subtract(z, z.max(axis=1, keepdims=True), out=p)
        np.exp(p, out=p)
        p /= p.sum(axis=1, keepdims=True)
        tg = ctx.targets.reshape(-1)
        y.reshape(-1)[:] = -np.log(p[np.arange(len(tg)), tg])

    def backward_input(self, ctx, x, y, dy, dx):
        p = ctx.stash.view(np.float32).reshape(-1, self.classes)
        d = dx.reshape(-1, self.classes)
        d[:] = p
        tg = ctx.targets.reshape(-1)
        d[np.arange(len(tg)), tg] -= 1.0
        d *= np.float32(ctx.loss_scale)


def build_model(a):
    m = bg.Model(name="numpy-mlp", input="features", features=a.features, seed=a.seed)
    c = a.features
    for i in range(a.layers):
        if a.tp is None:
            m.add(Linear("fc%d" % i, c, a.hidden))
        else:  # column- then row-parallel pairs: the tanh between them runs on each member's channels
            m.add((ColumnLinear if i % 2 == 0 else RowLinear)("fc%d" % i, c, a.hidden, a.tp, std=c ** -0.5))
        m.add(Tanh("act%d" % i))
        c = a.hidden
    m.add(Linear("out", c, a.classes))
    m.add(SoftmaxCE("loss", a.classes))
    return m.check()


def make_batches(a):
    teacher = np.random.default_rng(a.data_seed).standard_normal((a.features, a.classes)).astype(np.float32)

    def batches(rq):
        x = np.stack([np.random.default_rng([a.data_seed, rq.step, rq.first + i]).standard_normal(a.features)
                      for i in range(rq.n)]).astype(np.float32)
        return x, np.argmax(x @ teacher, axis=1).astype(np.int32)
    return batches


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pp", type=int, default=1, help="pipeline ranks")
    ap.add_argument("--dp", type=int, default=1, help="data-parallel replicas")
    ap.add_argument("--tp", type=int, help="tensor-parallel degree: the hidden linears become column- then "
                    "row-parallel pairs (--layers even); without it, plain linears")
    ap.add_argument("--zero", type=int, default=0, help="ZeRO stage across the dp replicas (0, 1, 2)")
    ap.add_argument("--schedule", default="1f1b", help="1f1b, gpipe, zb-h1, zb-v, ...")
    ap.add_argument("--chunks", type=int, default=0, help="model chunks per rank (zb-v, interleaved: 2)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32, help="samples per step")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--layers", type=int, default=3, help="hidden layers (linear + tanh each)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--features", type=int, default=16)
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1337, help="initialisation seed")
    ap.add_argument("--data-seed", type=int, default=7)
    ap.add_argument("--recompute", action="store_true", help="recompute activations in the backward")
    ap.add_argument("--threads", type=int, default=1, help="brigade's compute threads")
    ap.add_argument("--checkpoint", help="save a checkpoint here at the end (resume from it if one exists)")
    ap.add_argument("--save", help="write the final weights here")
    return ap.parse_args(argv)


def main():
    a = parse()
    if a.tp is not None and (a.tp < 1 or a.layers % 2):
        raise SystemExit("--tp needs a degree >= 1 and an even --layers (column/row pairs)")
    model = build_model(a)
    with bg.Executor(model, batches=make_batches(a), pp=a.pp, dp=a.dp, tp=a.tp or 1, zero=a.zero, schedule=a.schedule,
                     chunks=a.chunks, batch=a.batch, microbatches=a.microbatches, lr=a.lr, threads=a.threads,
                     recompute=a.recompute) as ex:
        if a.checkpoint and ex.resume(a.checkpoint) and ex.rank == 0:
            print("resumed at step %d" % ex.steps_done)
        while ex.steps_done < a.steps:
            r = ex.step()
            if ex.rank == 0:
                print("step %d loss %.6f" % (r.step, r.loss), flush=True)
        if a.checkpoint:
            ex.save_checkpoint(a.checkpoint)
        if a.save:
            ex.save_weights(a.save)


if __name__ == "__main__":
    main()
