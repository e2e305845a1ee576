#!/usr/bin/env python3
"""bench/python_layers.py: what running a layer's Python costs beyond its own
math (the ctypes callback, the GIL, the numpy views of brigade's buffers).

Owns only measuring; it changes nothing in the library or the binding.

1. Per call: a model of built-in layers with K identity Python layers
   inserted (forward and backward_input copy one small array) against the
   same model with K built-in relu layers instead (which cost the stage the
   same buffers and bookkeeping), on one process; (step time difference) /
   (Python layer calls) minus the time measured inside the methods = the
   overhead of one call outside the layer's own code.
2. Share of a step: the numpy MLP of python/examples/numpy_mlp.py at the
   given sizes; the time inside the layers' methods and the per-call
   overhead of (1) times its calls, each as a share of the step.

    BRIGADE_LIB=build/libbrigade.so PYTHONPATH=python python3 bench/python_layers.py
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "examples"))
import brigade as bg  # noqa: E402
import numpy_mlp as ex  # noqa: E402

INSIDE = [0.0, 0]  # seconds inside the Python layers' methods, calls


def timed(cls):
    """A subclass of layer class `cls` whose methods add their time to INSIDE."""
    def wrap(name):
        f = getattr(cls, name)

        def m(self, *a):
            t0 = time.perf_counter()
            f(self, *a)
            INSIDE[0] += time.perf_counter() - t0
            INSIDE[1] += 1
        return m
    body = {n: wrap(n) for n in ("forward", "backward_input", "backward_weight") if n in cls.__dict__}
    return type("Timed" + cls.__name__, (cls,), body)


class Identity(bg.Layer):
    def __init__(self, name):
        super().__init__(name)

    def forward(self, ctx, x, y):
        y[...] = x

    def backward_input(self, ctx, x, y, dy, dx):
        if dx is not None:
            dx[...] = dy


def batches_for(features, classes):
    def batches(rq):
        rng = np.random.default_rng([rq.step, rq.first])
        return (rng.standard_normal((rq.n, features)).astype(np.float32),
                rng.integers(0, classes, rq.n).astype(np.int32))
    return batches


def run(model, features, classes, a):
    """The fastest step's time (s) over a.steps steps after 3 warm-up steps (the machines are shared: the
    fastest is the one least disturbed), and the time inside the methods and their calls in that step."""
    with bg.Executor(model, batches=batches_for(features, classes), batch=a.batch, microbatches=a.microbatches,
                     lr=1e-3, threads=1) as e:
        for _ in range(3):
            e.step()
        best = None
        for _ in range(a.steps):
            INSIDE[:] = [0.0, 0]
            t0 = time.perf_counter()
            e.step()
            t = time.perf_counter() - t0
            if best is None or t < best[0]:
                best = (t, INSIDE[0], INSIDE[1])
    return best


def per_call(a):
    c = 64

    def model(k, make):
        m = bg.Model(name="ident", input="features", features=c, seed=1)
        m.add(bg.Linear("fc", c, c))
        for i in range(k):
            m.add(make("id%d" % i))
        return m.add(bg.Head("head", c, 8)).check()
    base, _, _ = run(model(0, None), c, 8, a)
    builtin, _, _ = run(model(a.identity, lambda n: bg.Activation(n, "relu")), c, 8, a)
    step, inside, calls = run(model(a.identity, timed(Identity)), c, 8, a)
    over = (step - builtin - inside) / calls
    print("per call: %d identity Python layers (width %d, microbatch %d): step %.2f ms; %.2f ms with as many "
          "built-in relu layers, %.2f ms with none; %d calls a step, %.1f us inside the methods a call, %.1f us "
          "outside them beyond a built-in layer's cost (%.1f us beyond no layer)"
          % (a.identity, c, a.batch // a.microbatches, step * 1e3, builtin * 1e3, base * 1e3, calls,
             inside / calls * 1e6, over * 1e6, (step - base - inside) / calls * 1e6))
    return over


def share(a, over):
    e = ex.parse(["--layers", str(a.layers), "--hidden", str(a.hidden), "--features", str(a.features)])
    m = bg.Model(name="mlp", input="features", features=e.features, seed=1)
    c = e.features
    for i in range(e.layers):
        m.add(timed(ex.Linear)("fc%d" % i, c, e.hidden)).add(timed(ex.Tanh)("act%d" % i))
        c = e.hidden
    m.add(timed(ex.Linear)("out", c, e.classes)).add(timed(ex.SoftmaxCE)("loss", e.classes))
    step, inside, calls = run(m.check(), e.features, e.classes, a)
    print("share of a step: numpy MLP (%d hidden layers of %d, batch %d in %d microbatches): step %.2f ms, "
          "%d Python layer calls, inside the methods %.2f ms (%.0f%%), outside them about %.2f ms (%.1f%%)"
          % (e.layers, e.hidden, a.batch, a.microbatches, step * 1e3, calls, inside * 1e3, 100 * inside / step,
             calls * over * 1e3, 100 * calls * over / step))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--identity", type=int, default=32, help="identity layers of the per-call measurement")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--features", type=int, default=256)
    a = ap.parse_args()
    share(a, per_call(a))


if __name__ == "__main__":
    main()
