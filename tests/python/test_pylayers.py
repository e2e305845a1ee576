"""tests/python/test_pylayers.py: layers written in Python (brigade.Layer
subclasses over numpy views of brigade's buffers), run by the C stage through
ctypes callbacks. Checks: gradients against finite differences through the
library's stage (and that the check catches a wrong backward); pp 2 and 3
under 1F1B, ZB-H1 and ZB-V give bitwise the weights and losses of one
process; ZeRO with recomputation against plain dp; checkpoint resume; an
exception inside a layer reaches the user once, with its traceback, on its
rank, and the other rank stops at once naming it; column- and row-parallel
Python layers (Param split, ctx.tp) at tp 2 and pp 2 x tp 2 within 1e-5 of
the plain MLP on one process, and ctx.tp's collectives. Needs numpy (skipped,
saying so, without it), BRIGADE (the CLI), BRIGADE_LIB and PYTHONPATH.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("BRIGADE_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
EXAMPLE = os.path.join(SOURCE, "python", "examples", "numpy_mlp.py")
BRIGADE = os.environ.get("BRIGADE", os.path.join(SOURCE, "build", "brigade"))

try:
    import numpy as np
except ImportError:
    np = None

if np is not None:
    import brigade as bg
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    import numpy_mlp as ex


def small_mlp(layers=2, hidden=8, first=None, extra=None):
    a = ex.parse(["--layers", str(layers), "--hidden", str(hidden)])
    m = bg.Model(name="t", input="features", features=a.features, seed=3)
    c = a.features
    for i in range(layers):
        m.add((first or ex.Linear)("fc%d" % i, c, hidden) if i == 0 else ex.Linear("fc%d" % i, c, hidden))
        m.add(ex.Tanh("act%d" % i))
        c = hidden
    if extra is not None:
        m.add(extra)
    m.add(ex.Linear("out", c, a.classes)).add(ex.SoftmaxCE("loss", a.classes))
    return m.check(), a


def data(a, n=6):
    rng = np.random.default_rng(11)
    return (rng.standard_normal((n, 1, a.features)).astype(np.float32),
            rng.integers(0, a.classes, (n, 1)).astype(np.int32))


def worst(rows):
    return max(abs(g - f) / max(abs(g), abs(f), 1e-2) for _, _, g, f in rows)


@unittest.skipIf(np is None, "numpy is not installed: Python layers need it (pip install numpy)")
class Layers(unittest.TestCase):
    def test_finite_differences(self):
        m, a = small_mlp()
        rows = bg.check_gradients(m, *data(a))
        self.assertEqual({r[0] for r in rows}, {"fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias", "out.weight",
                                                "out.bias"})
        self.assertLess(worst(rows), 5e-3, rows)

    def test_finite_differences_mixed_with_builtin_layers(self):  # and inside built-in composites
        a = ex.parse([])
        m = bg.Model(name="mix", input="features", features=a.features, seed=5)
        m.add(bg.Linear("fc", a.features, 12)).add(ex.Tanh("act")).add(ex.Linear("mid", 12, 12))
        m.add(bg.Residual("res", bg.Seq("body", [ex.Linear("inner", 12, 12), ex.Tanh("t")])))
        m.add(bg.Activation("gelu", "gelu")).add(bg.Head("head", 12, a.classes))
        rows = bg.check_gradients(m, *data(a))
        self.assertEqual({r[0] for r in rows}, {"fc.weight", "fc.bias", "mid.weight", "mid.bias", "head.weight",
                                                "head.bias", "res.body.inner.weight", "res.body.inner.bias"})
        self.assertLess(worst(rows), 5e-3, rows)

    def test_finite_differences_catch_a_wrong_backward(self):
        class Wrong(ex.Linear):  # dx is twice what it should be: the layers below get wrong gradients
            def backward_input(self, ctx, x, y, dy, dx):
                super().backward_input(ctx, x, y, dy, dx)
                if dx is not None:
                    dx *= 2

        a = ex.parse([])
        m = bg.Model(name="wrong", input="features", features=a.features, seed=3)
        m.add(ex.Linear("fc0", a.features, 8)).add(ex.Tanh("act0")).add(Wrong("fc1", 8, 8))
        m.add(ex.Linear("out", 8, a.classes)).add(ex.SoftmaxCE("loss", a.classes))
        rows = bg.check_gradients(m, *data(a))
        self.assertGreater(worst([r for r in rows if r[0].startswith("fc0")]), 0.3)
        self.assertLess(worst([r for r in rows if not r[0].startswith("fc0")]), 5e-3)

    def test_params_and_queries(self):
        m, a = small_mlp()
        self.assertEqual(m.classes, a.classes)
        self.assertEqual(m.param_count, (16 * 8 + 8) + (8 * 8 + 8) + (8 * 4 + 4))
        self.assertIn('"SoftmaxCE"', m.to_json())

    def test_refusals(self):
        with self.assertRaisesRegex(TypeError, "subclasses"):
            bg.Layer("x")

        class NoBackward(bg.Layer):
            def forward(self, ctx, x, y):
                y[...] = x
        with self.assertRaisesRegex(TypeError, "backward_input"):
            NoBackward("nb")

        class NoWeight(ex.Tanh):
            def __init__(self, name):
                bg.Layer.__init__(self, name, [bg.Param("w", (3,))])
        with self.assertRaisesRegex(TypeError, "no backward_weight"):
            NoWeight("nw")
        with self.assertRaisesRegex(ValueError, "init"):
            bg.Param("w", (3,), init="uniform")
        # a shape the layer refuses: check() raises the layer's own ValueError, with brigade's message as a note
        m = bg.Model(name="bad", input="features", features=16)
        m.add(ex.Linear("fc", 12, 4)).add(ex.SoftmaxCE("loss", 4))
        with self.assertRaisesRegex(ValueError, "fc: input has 16 channels, expected 12"):
            m.check()
        # a layer given twice
        t = ex.Tanh("t")
        bg.Model(name="a", input="features", features=4).add(t)
        with self.assertRaisesRegex(ValueError, "already belongs"):
            bg.Model(name="b", input="features", features=4).add(t)

    def test_size_method_raising(self):
        # sizes have no error status in C: the layer's call asking for its stash raises it again, and step() re-raises
        class BadStash(ex.SoftmaxCE):
            def stash_bytes(self, shape):
                raise OverflowError("no size for %r" % (shape,))

        a = ex.parse([])
        m = bg.Model(name="s", input="features", features=a.features, seed=1)
        m.add(ex.Linear("fc", a.features, 4)).add(BadStash("loss", 4)).check()
        with bg.Executor(m, batches=ex.make_batches(a), batch=8, microbatches=2, threads=1) as e:
            with self.assertRaisesRegex(OverflowError, r"no size for \(4, 1, 4\)"):
                e.step()

    def test_exception_in_one_process(self):
        class Boom(ex.Tanh):
            def forward(self, ctx, x, y):
                raise KeyError("boom in forward")

        m, a = small_mlp(extra=Boom("boom"))
        caught = None
        with bg.Executor(m, batches=ex.make_batches(a), batch=8, microbatches=2, threads=1) as e:
            try:  # not assertRaises: it drops the traceback
                e.step()
            except KeyError as err:
                caught = err
        self.assertIsNotNone(caught, "step() raised nothing")
        tb = caught.__traceback__
        frames = []
        while tb is not None:
            frames.append(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        self.assertEqual(frames[-1], "forward", "the traceback ends in the layer's method: %s" % frames)
        notes = getattr(caught, "__notes__", [])
        if sys.version_info >= (3, 11):
            self.assertTrue(any("python layer boom (Boom.forward) raised KeyError" in n for n in notes), notes)


class _Example:
    """Runs of the example (one process, or on brigade launch) into a class-wide temporary folder."""

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    @classmethod
    def run_example(cls, launch, args, name, steps=8):
        out = os.path.join(cls.tmp, name)
        cmd = [sys.executable, EXAMPLE, "--steps", str(steps), "--save", out] + args
        if launch:
            cmd = [BRIGADE, "launch", "-n", str(launch), "--timeout", "240", "--"] + cmd
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise AssertionError("%s failed (%d):\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr[-3000:]))
        losses = [float(x) for x in re.findall(r"^step \d+ loss ([0-9.]+)", p.stdout, re.M)]
        return out, losses

    def same_weights(self, a, b):
        r = bg.compare_weights(a, b)
        self.assertGreater(r["tensors"], 0)
        self.assertEqual(r["identical"], r["tensors"], "every tensor bitwise identical: %s" % r)


@unittest.skipIf(np is None, "numpy is not installed: Python layers need it (pip install numpy)")
class Pipelines(_Example, unittest.TestCase):
    """The example's Python-layer MLP on brigade launch against one process."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.ref, cls.ref_losses = cls.run_example(0, [], "one")

    def test_pipelines_equal_one_process(self):
        self.assertEqual(len(self.ref_losses), 8)
        self.assertLess(self.ref_losses[-1], self.ref_losses[0])
        for pp in (2, 3):
            for schedule in ("1f1b", "zb-h1", "zbv"):
                with self.subTest(pp=pp, schedule=schedule):
                    out, losses = self.run_example(pp, ["--pp", str(pp), "--schedule", schedule],
                                                   "pp%d-%s" % (pp, schedule))
                    self.assertEqual(losses, self.ref_losses)
                    self.same_weights(self.ref, out)

    def test_zero_and_recompute_equal_plain_dp(self):
        plain, l1 = self.run_example(2, ["--dp", "2"], "dp2")
        zero, l2 = self.run_example(4, ["--dp", "2", "--pp", "2", "--zero", "1", "--recompute"], "dp2-zero")
        self.assertEqual(l1, l2)
        self.same_weights(plain, zero)

    def test_checkpoint_resume(self):
        ck = os.path.join(self.tmp, "ck")
        self.run_example(2, ["--pp", "2", "--checkpoint", ck], "half", steps=4)
        out, losses = self.run_example(2, ["--pp", "2", "--checkpoint", ck], "resumed")
        self.assertEqual(losses, self.ref_losses[4:])
        self.same_weights(self.ref, out)

    def test_exception_reaches_the_user_once_and_the_other_rank_names_it(self):
        script = os.path.join(self.tmp, "raise.py")
        with open(script, "w") as f:
            f.write("""import sys
sys.path.insert(0, %r)
import numpy_mlp as ex
import brigade as bg
class Bad(ex.Tanh):
    calls = 0
    def backward_input(self, ctx, x, y, dy, dx):
        Bad.calls += 1
        if Bad.calls == 5:
            raise ZeroDivisionError("bad layer at call 5")
        super().backward_input(ctx, x, y, dy, dx)
a = ex.parse(["--pp", "2"])
m = bg.Model(name="bad", input="features", features=a.features, seed=1)
m.add(ex.Linear("fc0", a.features, 8)).add(ex.Tanh("t0")).add(ex.Linear("fc1", 8, 8))
m.add(Bad("bad")).add(ex.Linear("out", 8, 4)).add(ex.SoftmaxCE("loss", 4))
with bg.Executor(m, batches=ex.make_batches(a), pp=2, batch=8, microbatches=2, threads=1) as e:
    for s in range(5):
        e.step()
""" % os.path.dirname(EXAMPLE))
        cmd = [BRIGADE, "launch", "-n", "2", "--timeout", "120", "--tag-output", "--", sys.executable, script]
        env = dict(os.environ, BRIGADE_TIMEOUT="60")
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
        took = time.monotonic() - t0
        self.assertNotEqual(p.returncode, 0, "the failing job exited 0:\n" + p.stdout + p.stderr)
        self.assertLess(took, 30, "the job took %.1f s to stop (BRIGADE_TIMEOUT is 60)" % took)
        lines = (p.stdout + p.stderr).splitlines()
        rank1 = [l[len("[rank 1] "):] for l in lines if l.startswith("[rank 1] ")]
        rank0 = [l[len("[rank 0] "):] for l in lines if l.startswith("[rank 0] ")]
        self.assertEqual(sum(l.startswith("Traceback") for l in rank1), 1, "\n".join(rank1))
        self.assertIn("ZeroDivisionError: bad layer at call 5", rank1, "\n".join(rank1))
        self.assertTrue(any('raise ZeroDivisionError("bad layer at call 5")' in l for l in rank1),
                        "the traceback shows the layer's line:\n" + "\n".join(rank1))
        self.assertFalse(any("ZeroDivisionError: bad layer" == l[:27] for l in rank0))
        self.assertTrue(any(l.startswith("brigade._lib.BrigadeError") and "rank 1 stopped on an error" in l and
                            "python layer bad (Bad.backward_input) raised ZeroDivisionError" in l for l in rank0),
                        "rank 0 does not name rank 1 and its error:\n" + "\n".join(rank0))


def rel_l2(a_dir, b_dir):
    """Relative L2 of every tensor, by name, read back with numpy from the two saves (an independent reading of
    brigade compare's figure); asserts both hold the same names and shapes."""
    ra, rb = _safetensors(a_dir), _safetensors(b_dir)
    assert ra.keys() == rb.keys(), (sorted(ra), sorted(rb))
    out = {}
    for k in ra:
        assert ra[k].shape == rb[k].shape, (k, ra[k].shape, rb[k].shape)
        d = ra[k].astype(np.float64) - rb[k].astype(np.float64)
        out[k] = float(np.linalg.norm(d) / max(np.linalg.norm(ra[k].astype(np.float64)), 1e-30))
    return out


def _safetensors(d):
    import json
    import struct
    tensors = {}
    for fn in sorted(os.listdir(d)):
        if not fn.endswith(".safetensors"):
            continue
        with open(os.path.join(d, fn), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            head = json.loads(f.read(n))
            body = f.read()
        for k, v in head.items():
            if k == "__metadata__":
                continue
            assert v["dtype"] == "F32", (k, v["dtype"])
            b0, b1 = v["data_offsets"]
            tensors[k] = np.frombuffer(body[b0:b1], np.float32).reshape(v["shape"])
    assert tensors, "no safetensors under %s" % d
    return tensors


@unittest.skipIf(np is None, "numpy is not installed: Python layers need it (pip install numpy)")
class TensorParallel(_Example, unittest.TestCase):
    """The example's MLP with column- then row-parallel Python layers (ctx.tp's collectives, Param split) at tp 2
    against the plain MLP (numpy_mlp's Linear) on one process, after 10 AdamW steps."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.ref, cls.ref_losses = cls.run_example(0, ["--layers", "2"], "plain", steps=10)

    def close_to_plain(self, out, losses):
        self.assertEqual(len(losses), 10)
        for a, b in zip(losses, self.ref_losses):
            self.assertLess(abs(a - b), 1e-5 * abs(b), (losses, self.ref_losses))
        errs = rel_l2(self.ref, out)
        self.assertEqual(set(errs), {"fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias", "out.weight", "out.bias"})
        self.assertLess(max(errs.values()), 1e-5, errs)
        return errs

    def test_tp_layers_at_tp1_are_the_plain_mlp(self):
        out, losses = self.run_example(0, ["--layers", "2", "--tp", "1"], "tp1", steps=10)
        self.assertEqual(losses, self.ref_losses)
        self.same_weights(self.ref, out)

    def test_tp2_equals_tp1(self):
        out, losses = self.run_example(2, ["--layers", "2", "--tp", "2"], "tp2", steps=10)
        errs = self.close_to_plain(out, losses)
        print("tp 2 vs plain, relative L2 after 10 AdamW steps: max %.3g" % max(errs.values()))

    def test_pp2_x_tp2_equals_tp1(self):
        out, losses = self.run_example(4, ["--layers", "2", "--tp", "2", "--pp", "2", "--schedule", "zb-h1"],
                                       "pp2tp2", steps=10)
        errs = self.close_to_plain(out, losses)
        print("pp 2 x tp 2 (ZB-H1) vs plain, relative L2 after 10 AdamW steps: max %.3g" % max(errs.values()))

    def test_a_row_layer_without_its_sum_is_caught(self):  # the comparison above can fail
        script = os.path.join(self.tmp, "nosum.py")
        with open(script, "w") as f:
            f.write("""import sys
sys.path.insert(0, %r)
import numpy_mlp as ex
ex.RowLinear.forward = ex.Linear.forward  # each member's part, never summed
ex.main()
""" % os.path.dirname(EXAMPLE))
        out = os.path.join(self.tmp, "nosum")
        cmd = [BRIGADE, "launch", "-n", "2", "--timeout", "240", "--", sys.executable, script, "--layers", "2",
               "--tp", "2", "--steps", "10", "--save", out]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertGreater(max(rel_l2(self.ref, out).values()), 1e-3)

    def test_builder_tp(self):  # the binding's builders make the built-in tensor-parallel layers
        script = os.path.join(self.tmp, "builder.py")
        with open(script, "w") as f:
            f.write("""import sys
import numpy as np
import brigade as bg
tp = int(sys.argv[1])
m = bg.Model.mlp(layers=2, d_model=16, in_features=8, classes=4, seed=3, tp=tp)
def batches(rq):
    r = np.random.default_rng([rq.step, rq.first])
    return r.standard_normal((rq.n, 8)).astype(np.float32), r.integers(0, 4, rq.n).astype(np.int32)
with bg.Executor(m, batches=batches, tp=tp, batch=8, microbatches=2, threads=1) as e:
    for s in range(10):
        e.step()
    e.save_weights(sys.argv[2])
""")
        outs = []
        for tp in (1, 2):
            outs.append(os.path.join(self.tmp, "builder%d" % tp))
            cmd = [sys.executable, script, str(tp), outs[-1]]
            if tp > 1:
                cmd = [BRIGADE, "launch", "-n", str(tp), "--timeout", "240", "--"] + cmd
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-3000:])
        errs = rel_l2(outs[0], outs[1])
        self.assertEqual(len(errs), 6)
        self.assertLess(max(errs.values()), 1e-5, errs)

    def test_group_collectives_and_refusals(self):
        script = os.path.join(self.tmp, "probe.py")
        with open(script, "w") as f:
            f.write("""import sys
sys.path.insert(0, %r)
import numpy as np
import numpy_mlp as ex
import brigade as bg
seen = []
class Probe(ex.Tanh):  # checks ctx.tp's collectives against what every member must get
    def forward(self, ctx, x, y):
        g = ctx.tp
        assert g is not None and g.size == 2 and 0 <= g.rank < 2, g
        a = np.arange(6, dtype=np.float32).reshape(2, 3) * (g.rank + 1)
        g.allreduce(a)
        assert (a == np.arange(6, dtype=np.float32).reshape(2, 3) * 3).all(), a
        got = g.allgather(np.full((3,), g.rank, np.float32))
        assert got.shape == (2, 3) and (got == [[0, 0, 0], [1, 1, 1]]).all(), got
        for bad, err in ((np.zeros(3), TypeError), (np.zeros((4, 4), np.float32)[:, ::2], TypeError), (x, ValueError)):
            try:
                g.allreduce(bad)
            except err:
                pass
            else:
                raise AssertionError("allreduce took %%r" %% (bad,))
        seen.append(g.rank)
        super().forward(ctx, x, y)
a = ex.parse(["--layers", "2", "--tp", "2"])
m = bg.Model(name="probe", input="features", features=a.features, seed=1)
m.add(ex.ColumnLinear("fc0", a.features, 8, 2)).add(Probe("probe")).add(ex.RowLinear("fc1", 8, 8, 2))
m.add(ex.Linear("out", 8, 4)).add(ex.SoftmaxCE("loss", 4))
with bg.Executor(m, batches=ex.make_batches(a), tp=2, batch=8, microbatches=2, threads=1) as e:
    e.step()
print("probed", len(seen))
""" % os.path.dirname(EXAMPLE))
        cmd = [BRIGADE, "launch", "-n", "2", "--timeout", "120", "--", sys.executable, script]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-3000:])
        self.assertEqual(p.stdout.count("probed 2"), 2, p.stdout)
        # a model of degree-2 shards run without its group: refused
        a = ex.parse(["--layers", "2", "--tp", "2"])
        m = ex.build_model(a)
        with self.assertRaisesRegex(bg.BrigadeError, "tp = 1 but model numpy-mlp has tensor-parallel layers"):
            bg.Executor(m, batches=ex.make_batches(a), batch=8, microbatches=2, threads=1)
        with self.assertRaisesRegex(ValueError, "split"):
            bg.Param("w", (3, 4), split=(2, 2))


if __name__ == "__main__":
    unittest.main()
