"""tests/python/test_torch.py: PyTorch modules as brigade stages
(brigade.torch). python/examples/torch_gpt.py's GPT of its own modules,
trained 20 AdamW steps by brigade at pp 2 under 1F1B, ZB-H1 and ZB-V, equals
PyTorch's own single-process training of the same modules on the same
batches within 1e-5 relative L2 over all tensors, with the same per-step
losses to 5 decimals. Runs where torch imports, under this interpreter or
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


if __name__ == "__main__":
    unittest.main()
