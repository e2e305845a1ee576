"""python/setup.py: the build step of the brigade Python package.

Owns: the package's version (read from include/brigade/core.h, the one place
it is written) and what goes with the binding: the library and CLI built by
CMake from the source tree this file sits in (brigade/_native/lib and bin),
or, when a libbrigade is already installed, only where it is. It must not
install anything outside the package, nor build when it need not:
  - BRIGADE_LIB set, or `pkg-config brigade` found: nothing is built; the
    library's path and the CLI's (beside BRIGADE_LIB, or PREFIX/bin) are
    recorded in brigade/_native/installed for the binding to load;
  - else CMake builds targets brigade and brigade_cli (CUDA off unless
    BRIGADE_CUDA=ON, tests off, ccache when present) in python/build/native
    and installs them into the package.
"""
import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def version():
    text = open(os.path.join(ROOT, "include", "brigade", "core.h")).read()
    parts = [re.search(r"#define BRIGADE_VERSION_%s (\d+)" % k, text).group(1) for k in ("MAJOR", "MINOR", "PATCH")]
    v = ".".join(parts)
    binding = re.search(r'^VERSION = "([^"]+)"', open(os.path.join(HERE, "brigade", "_lib.py")).read(), re.M).group(1)
    if binding != v:
        raise RuntimeError("brigade: include/brigade/core.h says %s but brigade/_lib.py VERSION is %s" % (v, binding))
    return v


def installed_brigade():
    """(library path, CLI path or None) of an installed brigade: BRIGADE_LIB (the CLI: a brigade beside it, as in
    a build tree), else one that pkg-config knows (the CLI: PREFIX/bin/brigade); None when neither."""
    lib = os.environ.get("BRIGADE_LIB")
    if lib:
        lib = os.path.abspath(lib)
        cli = os.path.join(os.path.dirname(lib), "brigade")
        return lib, cli if os.path.isfile(cli) else None
    if not shutil.which("pkg-config"):
        return None
    out = {}
    for var in ("libdir", "prefix"):
        p = subprocess.run(["pkg-config", "--variable=" + var, "brigade"], capture_output=True, text=True)
        if p.returncode != 0 or not p.stdout.strip():
            return None
        out[var] = p.stdout.strip()
    cli = os.path.join(out["prefix"], "bin", "brigade")
    return os.path.join(out["libdir"], "libbrigade.so.0"), cli if os.path.isfile(cli) else None


def cmake_build(stage):
    """Build libbrigade and the CLI, install them under `stage`; returns (lib, bin) dirs."""
    cmake = shutil.which("cmake")
    if not cmake:
        raise RuntimeError("brigade: building the package needs cmake (or an installed libbrigade: set BRIGADE_LIB "
                           "or make `pkg-config brigade` find it)")
    build = os.path.join(HERE, "build", "native")
    args = [cmake, "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DBG_TESTS=OFF",
            "-DBG_CUDA=" + os.environ.get("BRIGADE_CUDA", "OFF"), "-DCMAKE_INSTALL_PREFIX=" + stage,
            "-DCMAKE_INSTALL_LIBDIR=lib", "-DCMAKE_INSTALL_BINDIR=bin"]
    if shutil.which("ccache"):
        args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    subprocess.run(args, check=True)
    subprocess.run([cmake, "--build", build, "-j", jobs, "--target", "brigade", "brigade_static", "brigade_cli"],
                   check=True)
    subprocess.run([cmake, "--install", build], check=True)
    return os.path.join(stage, "lib"), os.path.join(stage, "bin")


class BuildWithNative(build_py):
    def run(self):
        super().run()
        native = os.path.join(self.build_lib, "brigade", "_native")
        shutil.rmtree(native, ignore_errors=True)
        found = installed_brigade()
        if found:  # record where it is: the binding loads it with nothing set (brigade/_lib.py, __main__.py)
            os.makedirs(native)
            with open(os.path.join(native, "installed"), "w") as f:
                f.write("%s\n%s\n" % (found[0], found[1] or ""))
            return
        stage = os.path.join(HERE, "build", "native-install")
        shutil.rmtree(stage, ignore_errors=True)
        lib, bin_ = cmake_build(stage)
        os.makedirs(os.path.join(native, "lib"))
        os.makedirs(os.path.join(native, "bin"))
        # the SONAME the CLI and the binding load; copying follows the symlink
        shutil.copy2(os.path.join(lib, "libbrigade.so.%s" % version().split(".")[0]),
                     os.path.join(native, "lib"))
        shutil.copy2(os.path.join(bin_, "brigade"), os.path.join(native, "bin"))


setup(version=version(), cmdclass={"build_py": BuildWithNative})
