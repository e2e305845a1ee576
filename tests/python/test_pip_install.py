"""tests/python/test_pip_install.py: the package as a user installs it. In a
fresh virtual environment, `pip install --no-build-isolation python/` (after
`pip install wheel`, which such a build needs) builds libbrigade and the CLI
with CMake and installs them with the binding; then, with nothing else set
(no BRIGADE_LIB, no PYTHONPATH, a bare PATH), the package imports the library
it installed, `python -m brigade` and the `brigade` command run the CLI, and
the numpy example trains on one process and on `python -m brigade launch -n 2`
with bitwise the same weights. Then, installed again with BRIGADE_LIB set to
the build tree's library (BRIGADE_TEST_LIB), nothing is built and the
package loads that library and its CLI with nothing set. Needs a package index for wheel and numpy
(skipped, saying so, when pip cannot reach one). Minutes: CTest label slow.
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


class PipInstall(unittest.TestCase):
    def test_install_and_run_with_nothing_set(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        venv = os.path.join(tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        py, pip = os.path.join(venv, "bin", "python"), os.path.join(venv, "bin", "pip")
        p = subprocess.run([pip, "install", "-q", "wheel", "setuptools>=61"], capture_output=True, text=True,
                           timeout=300)
        if p.returncode != 0:
            self.skipTest("pip cannot install wheel and setuptools (no package index?): " + p.stderr[-500:])
        clean = {k: v for k, v in os.environ.items() if k not in ("BRIGADE_LIB", "BRIGADE", "PYTHONPATH")}
        p = subprocess.run([pip, "install", "--no-build-isolation", os.path.join(SOURCE, "python")],
                           capture_output=True, text=True, timeout=1500, env=clean)
        self.assertEqual(p.returncode, 0, "pip install failed:\n" + p.stdout[-3000:] + p.stderr[-3000:])

        env = {"HOME": tmp, "PATH": os.path.join(venv, "bin") + ":/usr/bin:/bin"}

        def run(*cmd, timeout=300):
            r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp)
            self.assertEqual(r.returncode, 0, "%s failed (%d):\n%s%s" % (" ".join(cmd), r.returncode, r.stdout,
                                                                        r.stderr[-3000:]))
            return r.stdout

        out = run(py, "-c", "import brigade, os; print(brigade.__version__); print(brigade.library_path)")
        version, path = out.split()
        self.assertTrue(path.startswith(venv), "the binding loads the library pip installed, not %s" % path)
        self.assertEqual(run(py, "-m", "brigade", "--version").strip(), "brigade " + version)
        self.assertEqual(run("brigade", "--version").strip(), "brigade " + version)

        # the example is copied out of the source tree: nothing may come from there
        example = os.path.join(tmp, "numpy_mlp.py")
        shutil.copy(os.path.join(SOURCE, "python", "examples", "numpy_mlp.py"), example)
        one, two = os.path.join(tmp, "one"), os.path.join(tmp, "two")
        l1 = run(py, example, "--steps", "5", "--save", one)
        l2 = run(py, "-m", "brigade", "launch", "-n", "2", "--timeout", "240", "--", py, example, "--steps", "5",
                 "--pp", "2", "--schedule", "zb-h1", "--save", two)
        losses = re.findall(r"^step \d+ loss ([0-9.]+)", l1, re.M)
        self.assertEqual(len(losses), 5, l1)
        self.assertEqual(losses, re.findall(r"^step \d+ loss ([0-9.]+)", l2, re.M))
        cmp_out = run("brigade", "compare", one, two)
        m = re.search(r"(\d+) tensors compared: (\d+) bitwise identical", cmp_out)
        self.assertTrue(m and m.group(1) == m.group(2) and int(m.group(1)) > 0, cmp_out)

        # an installed library instead (BRIGADE_TEST_LIB: a build tree's, its CLI beside it): nothing built, its
        # paths recorded, loaded with nothing set
        built = os.environ.get("BRIGADE_TEST_LIB")
        if built:
            p = subprocess.run([pip, "install", "--no-build-isolation", "--no-deps", "--force-reinstall",
                                os.path.join(SOURCE, "python")], capture_output=True, text=True, timeout=600,
                               env=dict(clean, BRIGADE_LIB=built))
            self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
            self.assertEqual(run(py, "-c", "import brigade; print(brigade.library_path)").strip(), built)
            self.assertEqual(run(py, "-m", "brigade", "--version").strip(), "brigade " + version)


if __name__ == "__main__":
    unittest.main()
