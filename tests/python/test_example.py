"""tests/python/test_example.py: python/examples/train_pipeline.py on a
2-stage pipeline (brigade launch -n 2, pp = 2) against one process (pp = 1):
the same seed and data must give bitwise the same final weights (brigade
compare), the same per-step losses, and a falling loss. Needs BRIGADE (the
CLI), BRIGADE_LIB and PYTHONPATH; see CMakeLists.txt.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("BRIGADE_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
EXAMPLE = os.path.join(SOURCE, "python", "examples", "train_pipeline.py")
BRIGADE = os.environ.get("BRIGADE", os.path.join(SOURCE, "build", "brigade"))


# The start of a script run by `brigade launch`: train_pipeline.py's model and batches, brigade as bg.
SCRIPT_PRELUDE = """import importlib.util, os, sys, time
spec = importlib.util.spec_from_file_location("train_pipeline", %r)
tp = importlib.util.module_from_spec(spec); spec.loader.exec_module(tp)
import brigade as bg
a = tp.argparse.Namespace(vocab=32, seq=16, d_model=32, layers=2, heads=4, seed=1, tie=False, data_seed=7,
                          no_numpy=True)
""" % EXAMPLE


class PipelineExample(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)

    def run_example(self, launch, args, name):
        out = os.path.join(self.tmp, name)
        cmd = [sys.executable, EXAMPLE, "--steps", "20", "--threads", "1", "--save", out] + args
        if launch:
            cmd = [BRIGADE, "launch", "-n", str(launch), "--timeout", "240", "--"] + cmd
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, "%s failed (%d):\n%s%s" % (" ".join(cmd), p.returncode, p.stdout,
                                                                    p.stderr[-3000:]))
        losses = [float(x) for x in re.findall(r"^step \d+ loss ([0-9.]+)", p.stdout, re.M)]
        self.assertEqual(len(losses), 20, "rank 0 prints one loss per step:\n" + p.stdout)
        return out, losses

    def check_same(self, extra, pipelined):
        one, l1 = self.run_example(0, ["--pp", "1"] + extra, "one")
        two, l2 = self.run_example(2, ["--pp", "2"] + extra + pipelined, "two")
        self.assertEqual(l1, l2, "per-step losses of the pipeline and of one process")
        self.assertLess(sum(l1[-3:]) / 3, 0.85 * l1[0], "the loss falls: %s" % l1)
        p = subprocess.run([BRIGADE, "compare", one, two], capture_output=True, text=True, timeout=120)
        m = re.search(r"(\d+) tensors compared: (\d+) bitwise identical", p.stdout)
        self.assertTrue(m, "brigade compare: " + p.stdout + p.stderr)
        self.assertEqual(p.returncode, 0, p.stdout)
        self.assertEqual(m.group(1), m.group(2), "every tensor bitwise identical: " + p.stdout)
        self.assertGreater(int(m.group(1)), 0)
        files = sorted(os.listdir(two))
        self.assertEqual(files, ["model-stage000.safetensors", "model-stage001.safetensors"])

    def test_error_in_with_block_is_not_hidden(self):
        # rank 0's batch source raises at step 2 inside `with Executor(...)` at pp 2: rank 0 ends with that
        # ValueError, not with the error its close() gets because the job did not end cleanly; rank 1 says why
        script = os.path.join(self.tmp, "raise.py")
        with open(script, "w") as f:
            f.write(SCRIPT_PRELUDE + """good = tp.make_batches(a)
def batches(rq):
    if rq.step == 2 and rq.first == 0:
        raise ValueError("bad batch at step 2: " + "x" * 400 + " (the end of a long message)")
    return good(rq)
with bg.Executor(tp.build_model(a), batches=batches, pp=2, batch=8, microbatches=2, threads=1) as ex:
    for s in range(5):
        ex.step()
""")
        cmd = [BRIGADE, "launch", "-n", "2", "--timeout", "120", "--tag-output", "--", sys.executable, script]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        self.assertNotEqual(p.returncode, 0, "the failing job exited 0:\n" + p.stdout + p.stderr)
        rank0 = [l[len("[rank 0] "):] for l in (p.stdout + p.stderr).splitlines() if l.startswith("[rank 0] ")]
        raised = [l for l in rank0 if re.match(r"^[\w.]+(Error|Exception): ", l)]
        self.assertTrue(raised, "rank 0 raised nothing:\n" + "\n".join(rank0))
        self.assertEqual(raised[-1], "ValueError: bad batch at step 2: " + "x" * 400 + " (the end of a long message)",
                         "rank 0's last exception is not the block's ValueError:\n" + "\n".join(rank0))
        # the other rank's error carries rank 0's message whole, the part that says what was wrong included
        rank1 = [l for l in (p.stdout + p.stderr).splitlines() if l.startswith("[rank 1] ")]
        self.assertTrue(any("rank 0" in l and "(the end of a long message)" in l for l in rank1),
                        "rank 1 does not give rank 0's whole message:\n" + "\n".join(rank1))

    def test_set_lr_disagreeing_fails_every_rank(self):
        # dp 2: rank 1 sets another learning rate from step 3 on; the step-end comparison fails that step on
        # both ranks, each naming the value, the step and the rank (it used to train silently apart)
        script = os.path.join(self.tmp, "lr.py")
        with open(script, "w") as f:
            f.write(SCRIPT_PRELUDE + """rank = int(os.environ["BRIGADE_RANK"])
with bg.Executor(tp.build_model(a), batches=tp.make_batches(a), dp=2, batch=8, microbatches=2, threads=1) as ex:
    for s in range(5):
        ex.set_lr(2e-3 if rank == 1 and s >= 2 else 1e-3)
        ex.step()
        print("passed step", s + 1, flush=True)
""")
        cmd = [BRIGADE, "launch", "-n", "2", "--timeout", "120", "--tag-output", "--", sys.executable, script]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        out = p.stdout + p.stderr
        self.assertNotEqual(p.returncode, 0, "the disagreeing job exited 0:\n" + out)
        for r in (0, 1):
            mine = [l for l in out.splitlines() if l.startswith("[rank %d] " % r)]
            self.assertIn("[rank %d] passed step 2" % r, mine, "\n".join(mine))
            self.assertNotIn("[rank %d] passed step 3" % r, mine, "\n".join(mine))
            self.assertTrue(any("disagree on the learning rate (bg_executor_set_lr) at step 3: rank 0 has 0.00100000005, "
                                "rank 1 has 0.00200000009" in l for l in mine), "\n".join(mine))

    def test_leaving_rank_is_announced(self):
        # pp 2: rank 1's host stops after step 2 and closes its executor, then stays alive; rank 0, in step 3,
        # fails within a second or so naming rank 1 and step 2 (it used to wait BRIGADE_TIMEOUT)
        script = os.path.join(self.tmp, "leave.py")
        with open(script, "w") as f:
            f.write(SCRIPT_PRELUDE + """rank = int(os.environ["BRIGADE_RANK"])
ex = bg.Executor(tp.build_model(a), batches=tp.make_batches(a), pp=2, batch=8, microbatches=2, threads=1)
for s in range(2 if rank == 1 else 5):
    t0 = time.monotonic()
    try:
        ex.step()
    except bg.BrigadeError as e:
        print("step %d failed after %.2f s: %s" % (s + 1, time.monotonic() - t0, e), flush=True)
        break
try:
    ex.close()
except bg.BrigadeError:
    pass
if rank == 1:
    time.sleep(8)  # alive: rank 0 learns it from the notice, not from this process's end
""")
        cmd = [BRIGADE, "launch", "-n", "2", "--timeout", "120", "--tag-output", "--", sys.executable, script]
        env = dict(os.environ, BRIGADE_TIMEOUT="20")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
        out = p.stdout + p.stderr
        m = re.search(r"^\[rank 0\] step 3 failed after ([0-9.]+) s: (.*)$", out, re.M)
        self.assertTrue(m, "rank 0's step 3 did not fail:\n" + out)
        print(m.group(0))
        self.assertLess(float(m.group(1)), 5.0, m.group(0))
        self.assertIn("rank 1 left the job after step 2", m.group(2))

    def test_pipeline_equals_one_process(self):
        self.check_same([], [])

    def test_tied_zero_bubble_plain_lists(self):
        # the tie crosses the two stages; the pipelined run feeds lists, the other numpy if present
        self.check_same(["--tie", "--layers", "3"], ["--schedule", "zb-h1", "--no-numpy"])


if __name__ == "__main__":
    unittest.main()
