"""tests/python/test_torch.py: PyTorch modules as brigade stages
(brigade.torch). python/examples/torch_gpt.py's GPT of its own modules,
trained 20 AdamW steps by brigade at pp 2 under 1F1B, ZB-H1 and ZB-V, equals
PyTorch's own single-process training of the same modules on the same
batches within 1e-5 relative L2 over all tensors, with the same per-step
losses to 5 decimals; no autograd graph outlives its microbatch (recomputation,
evaluation). Runs where torch imports, under this interpreter or
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


if __name__ == "__main__":
    unittest.main()
