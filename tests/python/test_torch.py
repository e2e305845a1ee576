"""tests/python/test_torch.py: PyTorch modules as brigade stages
(brigade.torch). python/examples/torch_gpt.py's GPT of its own modules,
trained 20 AdamW steps by brigade at pp 2 under 1F1B, ZB-H1 and ZB-V, equals
PyTorch's own single-process training of the same modules on the same
batches within 1e-5 relative L2 over all tensors, with the same per-step
losses to 5 decimals; no autograd graph outlives its microbatch (recomputation,
evaluation); brigade's buffers reach torch through DLPack, shared, never
copied. Runs where torch imports, under this interpreter or
BRIGADE_TORCH_PYTHON (a python with torch and numpy); skipped, saying so,
elsewhere (CI has no torch).
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("BRIGADE_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
EXAMPLE = os.path.join(SOURCE, "python", "examples", "torch_gpt.py")
BRIGADE = os.environ.get("BRIGADE", os.path.join(SOURCE, "build", "brigade"))


def torch_python():
    for py in (sys.executable, os.environ.get("BRIGADE_TORCH_PYTHON")):
        if py and subprocess.run([py, "-c", "import torch, numpy"], capture_output=True).returncode == 0:
            return py
    return None


PY = torch_python()

COMPARE = """import glob, sys, numpy as np
ref = dict(np.load(sys.argv[1]))
got = {}
for f in sys.argv[2:]:
    got.update(dict(np.load(f)))
assert set(ref) == set(got), sorted(set(ref) ^ set(got))
num = sum(float(((ref[k].astype(np.float64) - got[k]) ** 2).sum()) for k in ref)
den = sum(float((ref[k].astype(np.float64) ** 2).sum()) for k in ref)
print(len(ref), (num / den) ** 0.5)
"""


@unittest.skipIf(PY is None, "torch is not installed here (nor at BRIGADE_TORCH_PYTHON): brigade.torch is not tested")
class TorchStages(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.ref_losses = cls.train(0, ["--reference"], "ref")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    @classmethod
    def train(cls, launch, args, name):
        cmd = [PY, EXAMPLE, "--steps", "20", "--dump", os.path.join(cls.tmp, name)] + args
        if launch:
            cmd = [BRIGADE, "launch", "-n", str(launch), "--timeout", "400", "--"] + cmd
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
        if p.returncode != 0:
            raise AssertionError("%s failed (%d):\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr[-3000:]))
        return [float(x) for x in re.findall(r"^step \d+ loss ([0-9.]+)", p.stdout, re.M)]

    def test_pp2_equals_pytorch(self):
        self.assertEqual(len(self.ref_losses), 20)
        for schedule in ("1f1b", "zb-h1", "zbv"):
            with self.subTest(schedule=schedule):
                losses = self.train(2, ["--pp", "2", "--schedule", schedule], schedule)
                self.assertEqual(len(losses), 20)
                for a, b in zip(losses, self.ref_losses):
                    self.assertAlmostEqual(a, b, places=5)
                dumps = sorted(glob.glob(os.path.join(self.tmp, schedule, "rank*.npz")))
                self.assertEqual(len(dumps), 2)
                out = subprocess.run([PY, "-c", COMPARE, os.path.join(self.tmp, "ref", "reference.npz")] + dumps,
                                     capture_output=True, text=True, check=True).stdout.split()
                print("%s: %s tensors, relative L2 %s against PyTorch" % (schedule, out[0], out[1]), file=sys.stderr)
                self.assertGreater(int(out[0]), 20)
                self.assertLess(float(out[1]), 1e-5)


LEAK = """import argparse, sys
sys.path.insert(0, sys.argv[1])
import torch_gpt as ex
import brigade as bg, brigade.torch as bgt
a = argparse.Namespace(layers=2, d_model=32, heads=4, seq=16, vocab=32, seed=1337, data_seed=7, batch=8)
def run(recompute, schedule):
    layers = [bgt.Module(ln, m, loss=(ln == "head"), classes=a.vocab) for ln, m in ex.modules(a)]
    model = bg.Model(name="leak", input="tokens", vocab=a.vocab, seq_len=a.seq, seed=a.seed)
    for l in layers:
        model.add(l)
    losses, held = [], []
    with bg.Executor(model, batches=lambda rq: ex.batch(a, rq.step, rq.first, rq.n), schedule=schedule, batch=8,
                     microbatches=4, recompute=recompute, threads=1) as e:
        for _ in range(3):
            losses.append(e.step().loss)
            held.append(sum(l.live_graphs for l in layers))
        e.eval()
        held.append(sum(l.live_graphs for l in layers))
    return losses, held
for schedule in ("1f1b", "zb-h1"):
    plain, rec = run(False, schedule), run(True, schedule)
    print(schedule, "graphs held after each step and after eval: plain", plain[1], "recompute", rec[1])
    assert plain[1] == rec[1] == [0, 0, 0, 0], (plain[1], rec[1])
    assert plain[0] == rec[0], (plain[0], rec[0])
print("ok")
"""


@unittest.skipIf(PY is None, "torch is not installed here (nor at BRIGADE_TORCH_PYTHON): brigade.torch is not tested")
class TorchGraphs(unittest.TestCase):
    def test_no_graph_outlives_its_microbatch(self):
        # with recomputation the first forward's graph is never used (the backward runs the forward again), and
        # an evaluation has no backward: neither may leave a graph held once the step (or eval) is over
        p = subprocess.run([PY, "-c", LEAK, os.path.dirname(EXAMPLE)], capture_output=True, text=True, timeout=300)
        print(p.stdout, file=sys.stderr)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-3000:])
        self.assertIn("ok", p.stdout.split())


DLPACK = """import argparse, sys
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
import torch_gpt as ex
import brigade as bg, brigade.torch as bgt
from brigade import dlpack as dl
# a View of memory we own: torch and numpy import it without a copy, both DLPack versions, read-only flagged
a = np.arange(12, dtype=np.float32).reshape(3, 4)
v = dl.View(a.ctypes.data, a.shape)
t = torch.from_dlpack(v)
assert t.data_ptr() == a.ctypes.data and t.shape == (3, 4) and t.dtype == torch.float32
t[1, 2] = 42.0
assert a[1, 2] == 42.0
assert np.from_dlpack(v).ctypes.data == a.ctypes.data and np.asarray(v).ctypes.data == a.ctypes.data
assert v.__dlpack_device__() == (dl.KDL_CPU, 0)
assert torch.from_dlpack(dl.View(a.ctypes.data, (12,), "<i4")).dtype == torch.int32
for kw in ({}, {"max_version": (1, 0)}):
    for _ in range(200):  # consumed or not, each export is freed (run under a leak checker to see)
        c = v.__dlpack__(**kw)
        del c
for bad in ({"copy": True}, {"dl_device": (dl.KDL_CUDA, 0)}):
    try:
        v.__dlpack__(**bad)
    except BufferError:
        pass
    else:
        raise AssertionError("exported with %r" % (bad,))
# the module path: parameters, activations and gradients are brigade's buffers as torch tensors through DLPack
seen = []
class Spy(bgt.Module):
    def forward(self, ctx, x, y):
        assert isinstance(y, dl.View) and y.device == (dl.KDL_CPU, 0) and not y.readonly, y
        assert x is None or (isinstance(x, dl.View) and x.readonly), x
        super().forward(ctx, x, y)
        assert bgt._T(y).data_ptr() == y.address
        seen.append(self.name)
a = argparse.Namespace(layers=1, d_model=32, heads=4, seq=16, vocab=32, seed=1337, data_seed=7, batch=8)
layers = [(Spy if ln.startswith("blocks") else bgt.Module)(ln, m, loss=(ln == "head"), classes=a.vocab)
          for ln, m in ex.modules(a)]
model = bg.Model(name="dl", input="tokens", vocab=a.vocab, seq_len=a.seq, seed=a.seed)
for l in layers:
    model.add(l)
with bg.Executor(model, batches=lambda rq: ex.batch(a, rq.step, rq.first, rq.n), batch=8, microbatches=2,
                 threads=1) as e:
    e.step()
    for l in layers:
        for n, p in l.module.named_parameters():
            w, g = l.params[n], l.grads[n]
            assert isinstance(w, dl.View) and p.data_ptr() == w.address, (l.name, n)
            before = np.array(w)
            p.data.add_(1.0)  # the module's parameter is brigade's weight: the write shows there
            assert (np.asarray(w) == before + 1).all(), (l.name, n)
            p.data.sub_(1.0)
assert seen == ["blocks.0"] * 2, seen
print("ok")
"""


@unittest.skipIf(PY is None, "torch is not installed here (nor at BRIGADE_TORCH_PYTHON): brigade.torch is not tested")
class DLPack(unittest.TestCase):
    def test_views_are_shared_not_copied(self):
        p = subprocess.run([PY, "-c", DLPACK, os.path.dirname(EXAMPLE)], capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-3000:])
        self.assertIn("ok", p.stdout.split())


if __name__ == "__main__":
    unittest.main()
