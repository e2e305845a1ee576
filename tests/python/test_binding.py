"""tests/python/test_binding.py: the ctypes binding of libbrigade.

Struct layouts against the C compiler, models from layers and builders, the
executor on one process (lists and numpy batches, checkpoints, weights), and
every misuse the binding or the library must refuse with a message naming the
layer, tensor or step. Run: python3 -m unittest -v test_binding (from
tests/python, with PYTHONPATH=python and BRIGADE_LIB set; see CMakeLists.txt).
"""
import json
import os
import random
import shutil
import subprocess
import tempfile
import unittest

import brigade as bg
from brigade import _lib

try:
    import numpy as np
except ImportError:
    np = None

HERE = os.path.dirname(os.path.abspath(__file__))


def tiny_features(name="tiny", features=8, hidden=16, classes=4, seed=5):
    m = bg.Model(name=name, input="features", features=features, seed=seed)
    m.add(bg.Linear("fc", features, hidden))
    m.add(bg.LayerNorm("ln", hidden))
    m.add(bg.Residual("res", bg.Seq("mlp", [bg.Linear("up", hidden, hidden), bg.Activation("act", "relu")])))
    m.add(bg.Head("head", hidden, classes))
    return m.check()


def feature_batches(features=8, classes=4, shift=0):
    """A learnable task in plain Python: the class is which of the first
    `classes` features is largest. Deterministic in (step, sequence)."""
    def batches(rq):
        xs, ys = [], []
        for i in range(rq.n):
            r = random.Random(rq.step * 7919 + rq.first + i + shift)
            x = [r.gauss(0.0, 1.0) for _ in range(features)]
            xs.append([x])
            ys.append([max(range(classes), key=lambda k: x[k])])
        return xs, ys
    return batches


class StructLayout(unittest.TestCase):
    """Every mirrored struct has the C size, field offsets and field sizes."""

    def layout(self):
        tool = os.environ.get("BRIGADE_STRUCT_LAYOUT")
        if not tool:  # outside ctest: compile the helper
            cc = shutil.which("cc") or shutil.which("gcc")
            src = os.environ.get("BRIGADE_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
            if not cc:
                self.skipTest("no C compiler and BRIGADE_STRUCT_LAYOUT unset")
            tool = os.path.join(tempfile.mkdtemp(), "layout")
            self.addCleanup(shutil.rmtree, os.path.dirname(tool))
            subprocess.run([cc, "-I", os.path.join(src, "include"), os.path.join(HERE, "struct_layout.c"), "-o",
                            tool], check=True)
        out = subprocess.run([tool], check=True, capture_output=True, text=True).stdout
        sizes, fields = {}, {}
        for line in out.splitlines():
            t, f, a, *b = line.split()
            if f == "-":
                sizes[t] = int(a)
            else:
                fields.setdefault(t, {})[f] = (int(a), int(b[0]))
        return sizes, fields

    def test_structs_match_c(self):
        sizes, fields = self.layout()
        self.assertEqual(set(sizes), set(_lib.STRUCTS), "structs mirrored vs structs the C helper prints")
        for cname, cls in _lib.STRUCTS.items():
            with self.subTest(struct=cname):
                import ctypes
                self.assertEqual(ctypes.sizeof(cls), sizes[cname], "sizeof(%s)" % cname)
                py = {_lib.C_FIELD.get(f, f): getattr(cls, f) for f, _ in cls._fields_}
                self.assertEqual(set(py), set(fields[cname]), "fields of %s" % cname)
                for f, (off, size) in fields[cname].items():
                    self.assertEqual((py[f].offset, py[f].size), (off, size), "%s.%s (offset, size)" % (cname, f))

    def test_library_is_the_built_one(self):
        if os.environ.get("BRIGADE_LIB"):
            self.assertEqual(bg.library_path, os.environ["BRIGADE_LIB"])

    def test_version_checked_against_the_library(self):
        self.assertEqual(bg.__version__, _lib.lib.bg_version().decode())
        saved = _lib.VERSION
        try:
            _lib.VERSION = "9.9.9"
            with self.assertRaisesRegex(ImportError, r"binding is version 9\.9\.9 but .* is libbrigade " +
                                        bg.__version__.replace(".", r"\.")):
                _lib.check_version()
        finally:
            _lib.VERSION = saved


class Models(unittest.TestCase):
    def test_layers_and_queries(self):
        m = tiny_features()
        self.assertEqual(m.layers, ["fc", "ln", "res", "head"])
        self.assertEqual((m.name, m.input, m.features, m.seed, m.classes), ("tiny", "features", 8, 5, 4))
        self.assertEqual(m.input_shape(3), (3, 1, 8))
        self.assertEqual(m.param_count, (8 * 16 + 16) + 2 * 16 + (16 * 16 + 16) + (16 * 4 + 4))
        self.assertEqual(m.tensor_layer("res.mlp.up.weight"), 2)
        self.assertEqual(m.tensor_layer("nope"), -1)
        d = json.loads(m.to_json())
        self.assertEqual([l["name"] for l in d["layers"]], m.layers)
        shapes = {t["name"]: t["shape"] for t in d["tensors"]}
        self.assertEqual(shapes["res.mlp.up.weight"], [16, 16])
        self.assertEqual(shapes["fc.weight"], [16, 8])
        m.close()
        self.assertIn("closed", repr(m))
        with self.assertRaises(ValueError):
            m.check()

    def test_token_model_with_tie(self):
        m = bg.Model(name="tok", input="tokens", vocab=16, seq_len=8)
        m.add(bg.Embedding("embed", 16, 8, 12)).add(bg.TransformerBlock("block", 12, 3))
        m.add(bg.LayerNorm("ln_f", 12)).add(bg.Head("head", 12, 16, bias=False))
        m.tie("embed.wte", "head.weight").check()
        self.assertEqual(m.ties, [("embed.wte", "head.weight")])
        self.assertEqual(m.input_shape(2, 5), (2, 5))
        self.assertEqual(json.loads(m.to_json())["ties"], [["embed.wte", "head.weight"]])

    def test_builders(self):
        g = bg.Model.gpt(layers=2, d_model=16, heads=2, seq_len=8, vocab=32, tie_embeddings=True)
        self.assertEqual(g.layers, ["embed", "blocks.0", "blocks.1", "ln_f", "head"])
        self.assertEqual(g.ties, [("embed.wte", "head.weight")])
        self.assertEqual((g.input, g.vocab, g.seq_len, g.classes), ("tokens", 32, 8, 32))
        again = bg.Model.from_json(g.to_json())
        self.assertEqual(again.to_json(), g.to_json())
        mlp = bg.Model.mlp(layers=2, d_model=8, in_features=5, classes=3)
        self.assertEqual((mlp.input, mlp.features, mlp.classes), ("features", 5, 3))
        with self.assertRaises(bg.BrigadeError) as e:
            bg.Model.gpt(layers=2, d_model=10, heads=3)
        self.assertIn("heads", e.exception.message)

    def test_tie_of_different_shapes(self):
        m = bg.Model(name="ties", input="features", features=16)
        m.add(bg.Linear("fc", 16, 32)).add(bg.Linear("fc2", 32, 16)).add(bg.Head("head", 16, 4))
        m.check()
        m.tie("fc.weight", "fc2.weight")
        with self.assertRaises(bg.BrigadeError) as e:
            m.check()
        self.assertEqual(e.exception.status, bg.Status.ERR_INVALID)
        self.assertIn("fc.weight -> fc2.weight", e.exception.message)
        self.assertIn("[32, 16] vs [16, 32]", e.exception.message)
        self.assertIn("invalid argument", str(e.exception))

    def test_tie_to_missing_tensor(self):
        m = tiny_features()
        m.tie("fc.weight", "head.wieght")
        with self.assertRaisesRegex(bg.BrigadeError, "no tensor head.wieght"):
            m.check()

    def test_last_layer_not_a_loss(self):
        m = bg.Model(name="noloss", input="features", features=4)
        m.add(bg.Linear("fc", 4, 8)).add(bg.Linear("out", 8, 2))
        with self.assertRaisesRegex(bg.BrigadeError, "last layer out .*not a loss layer"):
            m.check()
        with self.assertRaisesRegex(bg.BrigadeError, "noloss has no layers"):
            bg.Model(name="noloss", input="features", features=4).check()

    def test_shapes_that_do_not_chain(self):
        m = bg.Model(name="chain", input="features", features=4)
        m.add(bg.Linear("fc", 4, 8)).add(bg.LayerNorm("ln", 7)).add(bg.Head("head", 8, 2))
        with self.assertRaisesRegex(bg.BrigadeError, "layer ln"):
            m.check()

    def test_layer_misuse(self):
        with self.assertRaisesRegex(bg.BrigadeError, "attention att: heads \\(3\\) must divide"):
            bg.Attention("att", 10, 3)
        with self.assertRaisesRegex(ValueError, "activation 'a'.*gelu, relu.*'tanh'"):
            bg.Activation("a", "tanh")
        with self.assertRaisesRegex(ValueError, "input must be"):
            bg.Model(input="images")
        m = bg.Model(name="m", input="features", features=4)
        fc = bg.Linear("fc", 4, 4)
        self.assertEqual(fc.param_count, 20)
        m.add(fc)
        with self.assertRaisesRegex(ValueError, "layer 'fc' \\(linear\\) already belongs to model 'm'"):
            m.add(fc)
        with self.assertRaisesRegex(ValueError, "layer 'fc' .*already belongs to model 'm'"):
            bg.Seq("s", [bg.Linear("x", 4, 4), fc])
        with self.assertRaisesRegex(bg.BrigadeError, "two top-level layers are named \"fc\""):
            m.add(bg.Linear("fc", 4, 4))
        with self.assertRaises(TypeError):
            m.add("fc")
        self.assertEqual(bg.Head("h", 4, 3).loss_classes, 3)
        # a layer made by C code is adopted, then owned like any other
        import ctypes
        h = ctypes.c_void_p()
        self.assertEqual(_lib.lib.bg_layer_linear(b"made_in_c", 4, 2, 1, 0.02, ctypes.byref(h)), 0)
        c = bg.Layer.adopt(h)
        self.assertEqual((c.name, c.param_count), ("made_in_c", 10))
        m.add(c)
        self.assertEqual(m.layers, ["fc", "made_in_c"])
        with self.assertRaises(ValueError):
            bg.Layer.adopt(None)
        self.assertEqual(bg.Seq("s", [bg.Linear("x", 4, 4), bg.Head("h", 4, 3)]).loss_classes, 3)


class Training(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)

    def executor(self, model, batches, **kw):
        args = dict(batch=8, microbatches=2, lr=1e-2, threads=1)
        args.update(kw)
        return bg.Executor(model, batches=batches, **args)

    def test_loss_falls_with_python_lists(self):
        m = tiny_features()
        with self.executor(m, feature_batches()) as ex:
            info = ex.info()
            self.assertEqual((info.rank, info.world, info.stages, info.schedule), (0, 1, 1, "1f1b"))
            self.assertEqual(info.params, m.param_count)
            losses = [ex.step().loss for _ in range(30)]
            self.assertEqual(ex.steps_done, 30)
        self.assertLess(sum(losses[-5:]) / 5, 0.7 * losses[0], losses)

    def test_llama(self):
        m = bg.Model.llama(layers=2, d_model=16, heads=4, kv_heads=2, seq_len=8, vocab=32, tie_embeddings=True)
        self.assertIn('"name":"llama"', m.to_json())
        self.assertIn('"kv_heads":2', m.to_json())
        with self.assertRaises(bg.BrigadeError):
            bg.Model.llama(layers=1, d_model=16, heads=4, kv_heads=3)

    def test_moe_builders(self):
        g = bg.Model.gpt(layers=2, d_model=16, heads=2, seq_len=8, vocab=32,
                         moe={"experts": 4, "top_k": 2, "moe_every": 2, "capacity_factor": 1.25})
        shapes = {t["name"]: t["shape"] for t in json.loads(g.to_json())["tensors"]}
        # block 1 only (moe_every 2); experts' hidden size 8 * 16 / 3 rounded up to 64
        self.assertEqual(shapes["blocks.1.mlp.moe.router"], [4, 16])
        self.assertEqual(shapes["blocks.1.mlp.moe.up"], [4, 128, 16])
        self.assertEqual(shapes["blocks.1.mlp.moe.down"], [4, 16, 64])
        self.assertNotIn("blocks.0.mlp.moe.router", shapes)
        self.assertEqual(bg.Model.from_json(g.to_json()).to_json(), g.to_json())
        dense = bg.Model.gpt(layers=2, d_model=16, heads=2, seq_len=8, vocab=32)
        self.assertNotIn('"experts"', dense.to_json())
        m = bg.Model.llama(layers=1, d_model=16, heads=4, seq_len=8, vocab=32, ffn_hidden=24,
                           moe={"experts": 2, "top_k": 1, "moe_gate": "sigmoid"})
        self.assertIn('"moe_gate":"sigmoid"', m.to_json())
        with self.assertRaises(bg.BrigadeError) as e:
            bg.Model.gpt(layers=1, d_model=16, heads=2, moe={"experts": 2, "top_k": 3})
        self.assertIn("top_k 3", e.exception.message)
        with self.assertRaises(ValueError):
            bg.Model.gpt(layers=1, d_model=16, heads=2, moe={"expert": 2})

    def test_eval(self):
        m = tiny_features()
        held = feature_batches(shift=1000)
        with self.executor(m, feature_batches()) as ex:
            e0 = ex.eval()  # the training batches' batch 0, before any step: step 1's loss bitwise
            self.assertEqual(e0.loss, ex.step().loss)
            self.assertEqual(e0.tokens, 8.0)
            a = ex.eval(3, batches=held)
            self.assertEqual(ex.eval(3, batches=held).loss, a.loss)  # changes nothing
            self.assertEqual(ex.steps_done, 1)
            with self.assertRaises(TypeError):
                ex.eval(0, batches=3)
            with self.assertRaises(bg.BrigadeError):
                ex.eval(-1)
            with self.assertRaises(ZeroDivisionError):  # the callable's own exception, re-raised
                ex.eval(0, batches=lambda rq: 1 / 0)

    def test_bf16_gpt(self):
        self.assertEqual(bg.Model.gpt(layers=1, d_model=16, heads=2, seq_len=8).precision, "fp32")
        m = bg.Model.gpt(layers=1, d_model=16, heads=2, seq_len=8, precision="bf16")
        self.assertEqual(m.precision, "bf16")
        with self.assertRaises(ValueError):
            bg.Model.gpt(precision="fp16")

    def test_sgd_and_lr(self):
        m = tiny_features()
        with self.executor(m, feature_batches(), optimizer="sgd", lr=0.1) as ex:
            r = ex.step()
            self.assertEqual((r.step, r.tokens, r.stop), (1, 8.0, False))
            ex.set_lr(0.05)
            with self.assertRaises(ValueError):
                ex.set_lr(0)
            ex.request_stop()
            self.assertTrue(ex.step().stop)

    def test_checkpoint_resume_and_weights(self):
        ck, w = os.path.join(self.tmp, "ck"), os.path.join(self.tmp, "w")
        with self.executor(tiny_features(), feature_batches()) as ex:
            for _ in range(3):
                ex.step()
            ex.save_checkpoint(ck, keep=1)
            later = [ex.step().loss for _ in range(2)]
            ex.save_weights(w)
        with self.executor(tiny_features(), feature_batches()) as ex:
            self.assertFalse(ex.resume(os.path.join(self.tmp, "none")))
            self.assertTrue(ex.resume(ck))
            self.assertEqual(ex.steps_done, 3)
            self.assertEqual([ex.step().loss for _ in range(2)], later)  # bitwise: same floats
            ex.save_weights(os.path.join(self.tmp, "w2"))
        self.assertEqual(bg.compare_weights(w, os.path.join(self.tmp, "w2"))["identical"], 8)
        with self.executor(tiny_features(), feature_batches()) as ex:
            ex.load_weights(w)
            ex.save_weights(os.path.join(self.tmp, "w3"))
        c = bg.compare_weights(w, os.path.join(self.tmp, "w3"))
        self.assertEqual((c["tensors"], c["identical"]), (8, 8))
        with self.executor(tiny_features(name="other"), feature_batches()) as ex:
            with self.assertRaisesRegex(bg.BrigadeError, "another model"):
                ex.resume(ck)

    def test_offload_optimizer(self):
        """offload="optimizer" (files under offload_dir): the weights of no offload, bitwise; what is not built refused."""
        outs = []
        for kw in ({}, {"offload": "optimizer", "offload_dir": os.path.join(self.tmp, "od")}):
            with self.executor(tiny_features(), feature_batches(), **kw) as ex:
                for _ in range(3):
                    ex.step()
                outs.append(os.path.join(self.tmp, "w%d" % len(outs)))
                ex.save_weights(outs[-1])
        self.assertEqual(bg.compare_weights(outs[0], outs[1])["identical"], 8)
        self.assertEqual(os.listdir(os.path.join(self.tmp, "od")), [])
        with self.assertRaisesRegex(bg.BrigadeError, "--offload params"):
            self.executor(tiny_features(), feature_batches(), offload=["optimizer", "params"])
        with self.assertRaises(ValueError):
            self.executor(tiny_features(), feature_batches(), offload="optimiser")

    def test_wrong_shape_names_the_step(self):
        def batches(rq):
            x, y = feature_batches()(rq)
            return x, (y[:-1] if rq.step == 1 and rq.microbatch == 1 else y)
        with self.executor(tiny_features(), batches) as ex:
            ex.step()
            with self.assertRaises(ValueError) as e:
                ex.step()
            msg = str(e.exception)
            self.assertIn("step 2, microbatch 1, replica 0", msg)
            self.assertIn("targets (class ids) has 3 entries where 4 were expected", msg)
            self.assertIn("(4, 1) or (4,)", msg)
            with self.assertRaisesRegex(bg.BrigadeError, "earlier step failed"):
                ex.step()

    def test_wrong_element_type(self):
        def batches(rq):
            x, y = feature_batches()(rq)
            y[2][0] = 1.5
            return x, y
        with self.executor(tiny_features(), batches) as ex:
            with self.assertRaisesRegex(ValueError, r"targets \(class ids\)\[2\]\[0\] is 1.5 \(float\), not an integer"):
                ex.step()

    def test_callable_raises(self):
        def batches(rq):
            if rq.step == 2:
                raise KeyError("no data for step %d" % rq.step)
            return feature_batches()(rq)
        with self.executor(tiny_features(), batches) as ex:
            ex.step()
            ex.step()
            with self.assertRaises(KeyError) as e:
                ex.step()
            notes = " ".join(getattr(e.exception, "__notes__", []))
            if hasattr(e.exception, "add_note"):
                self.assertIn("at step 3", notes)
                self.assertIn("batch callable raised KeyError", notes)

    def test_bad_return(self):
        with self.executor(tiny_features(), lambda rq: [[0.0] * 8] * rq.n) as ex:
            with self.assertRaisesRegex(ValueError, "must return \\(inputs, targets\\), got list"):
                ex.step()
        with self.executor(tiny_features(), lambda rq: (None, [0] * rq.n)) as ex:
            with self.assertRaisesRegex(ValueError, "returned no inputs"):
                ex.step()

    def test_values_checked_by_the_library(self):
        with self.executor(tiny_features(), lambda rq: ([[0.0] * 8] * rq.n, [9] * rq.n)) as ex:
            with self.assertRaisesRegex(bg.BrigadeError, "target 0 of 4 is 9, outside the loss layer's classes"):
                ex.step()

    def test_executor_params_refused(self):
        m = tiny_features()
        with self.assertRaisesRegex(bg.BrigadeError, "batch 10 does not split into 1 replicas x 4"):
            self.executor(m, feature_batches(), batch=10, microbatches=4)
        with self.assertRaisesRegex(bg.BrigadeError, "brigade launch -n 2"):
            self.executor(m, feature_batches(), pp=2)
        with self.assertRaises(bg.BrigadeError):
            self.executor(m, feature_batches(), schedule="nope")
        with self.assertRaisesRegex(ValueError, "optimizer"):
            self.executor(m, feature_batches(), optimizer="lion")
        with self.assertRaises(TypeError):
            bg.Executor(m, batches=None)
        bad = bg.Model(name="bad", input="features", features=4)
        bad.add(bg.Linear("fc", 4, 4))
        with self.assertRaisesRegex(bg.BrigadeError, "not a loss layer"):
            self.executor(bad, feature_batches())

    def test_model_lifetime(self):
        m = tiny_features()
        ex = self.executor(m, feature_batches())
        with self.assertRaisesRegex(ValueError, "already used by a live executor"):
            self.executor(m, feature_batches())
        with self.assertRaisesRegex(ValueError, "while an executor uses it"):
            m.add(bg.Linear("more", 4, 4))
        with self.assertRaisesRegex(ValueError, "while an executor uses it"):
            m.close()
        del m  # the executor keeps the description alive
        ex.step()
        model = ex.model
        ex.close()
        ex.close()
        with self.assertRaisesRegex(ValueError, "executor is closed"):
            ex.step()
        model.close()

    def test_seq_len_callable(self):
        seen = []

        def batches(rq):
            seen.append(rq.t)
            return [[(i + rq.step) % 16 for i in range(rq.t)]] * rq.n, [[(i + 1) % 16 for i in range(rq.t)]] * rq.n
        m = bg.Model.gpt(layers=1, d_model=8, heads=2, seq_len=8, vocab=16)
        with self.executor(m, batches, seq_len=lambda step, mb: 3 + (step + mb) % 6) as ex:
            ex.step()
            ex.step()
        self.assertEqual(seen, [3, 4, 4, 5])
        with self.executor(bg.Model.gpt(layers=1, d_model=8, heads=2, seq_len=8, vocab=16), batches,
                           seq_len=lambda step, mb: 1 // (1 - step)) as ex:
            ex.step()
            with self.assertRaises(ZeroDivisionError):
                ex.step()

    @unittest.skipIf(np is None, "numpy is not installed")
    def test_numpy_batches(self):
        def batches(rq):
            rng = np.random.default_rng(rq.step * 1000 + rq.first)
            start = rng.integers(0, 16, size=(rq.n, 1))
            seq = (start + np.arange(rq.t + 1)[None, :]) % 16
            return seq[:, :-1].astype(np.int64), seq[:, 1:].astype(np.uint8)
        m = bg.Model.gpt(layers=1, d_model=16, heads=2, seq_len=8, vocab=16)
        with self.executor(m, batches, lr=1e-2) as ex:
            losses = [ex.step().loss for _ in range(15)]
        self.assertLess(losses[-1], losses[0])

        def floats(rq):
            x, y = batches(rq)
            return x.astype(np.float64), y
        with self.executor(bg.Model.gpt(layers=1, d_model=16, heads=2, seq_len=8, vocab=16), floats) as ex:
            with self.assertRaisesRegex(ValueError, "step 1, microbatch 0.*inputs \\(token ids\\) must be integers "
                                                    "\\(int32\\), got dtype float64"):
                ex.step()

        def short(rq):
            x, y = batches(rq)
            return x[:, :-1], y
        with self.executor(bg.Model.gpt(layers=1, d_model=16, heads=2, seq_len=8, vocab=16), short) as ex:
            with self.assertRaisesRegex(ValueError, "inputs \\(token ids\\) must have shape \\(4, 8\\), got \\(4, 7\\)"):
                ex.step()

        def features(rq):
            x, y = feature_batches()(rq)
            return np.array(x, dtype=np.float32)[:, 0, :], np.array(y)[:, 0]  # (n, c) and (n,): t is 1
        with self.executor(tiny_features(), features) as ex:
            ex.step()

        def ints(rq):
            x, y = feature_batches()(rq)
            return np.array(x, dtype=np.int32), np.array(y)
        with self.executor(tiny_features(), ints) as ex:
            with self.assertRaisesRegex(ValueError, "inputs \\(features\\) must be floats \\(float32\\), got dtype int32"):
                ex.step()


if __name__ == "__main__":
    unittest.main()
