"""Build of grape: setuptools calls CMake (CMakeLists.txt is the one description of the build).

    pip install --no-build-isolation -e .   # development: grape/_C in place, C++ tests in build/cmake
    pip install --no-build-isolation .      # a regular install (no network needed)
    pip install .                           # the same, build tools fetched into pip's build env

The extension is compiled against the torch installed in the Python that runs the build (torch is
no build requirement, see pyproject.toml); inside pip's isolated build environment, where torch is
not importable, that Python is asked outside it. Environment: GRAPE_CUDA=0 builds without CUDA;
GRAPE_CUDA_ARCHS="80;90" picks GPU architectures; GRAPE_BUILD_TESTS=1/0 builds the GoogleTest
binary or not (default: only for in-place and editable builds); MAX_JOBS limits compile jobs.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def find_nvcc():
    candidates = []
    for var in ("CUDACXX", "CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(var)
        if value:
            candidates.append(value if var == "CUDACXX" else os.path.join(value, "bin", "nvcc"))
    candidates += ["/usr/local/cuda/bin/nvcc", shutil.which("nvcc") or ""]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def cuda_library_includes(torch_dir, nvcc_path):
    """Headers of the CUDA libraries torch's own headers include (cuBLAS, cuSPARSE, cuSOLVER).

    A toolkit with only the compiler lacks them; pip-installed torch ships them in the nvidia
    packages next to it. Listed after the toolkit's, so the toolkit's runtime headers win."""
    toolkit = os.path.join(os.path.dirname(os.path.dirname(nvcc_path)), "include") if nvcc_path else None
    if toolkit and os.path.isfile(os.path.join(toolkit, "cusparse.h")):
        return []
    site = os.path.dirname(torch_dir)
    found = []
    for pattern in ("nvidia/*/include", "nvidia/*/*/include"):
        for d in sorted(glob.glob(os.path.join(site, pattern))):
            if os.path.isfile(os.path.join(d, "cusparse.h")) or os.path.isfile(os.path.join(d, "cublas_v2.h")):
                found.append(d)
    return found


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


# What the build needs from torch, printed as JSON by the Python that will import grape.
TORCH_QUERY = r"""
import json, os, torch, torch.utils.cpp_extension as cpp
try:
    includes = cpp.include_paths(device_type="cuda")
except TypeError:  # older torch
    includes = cpp.include_paths(cuda=True)
print(json.dumps({"version": torch.__version__, "dir": os.path.dirname(torch.__file__),
                  "includes": list(includes), "cuda": torch.version.cuda,
                  "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI)}))
"""


def query_torch():
    """The installed torch's version, directory, include paths, CUDA version and C++ ABI.

    Asked in a child process of this Python: torch in place (`pip install --no-build-isolation`,
    `setup.py build_ext`) or, failing that, as this Python sees it outside pip's isolated build
    environment (which hides site-packages through PYTHONPATH and PYTHONNOUSERSITE). Either way the
    extension is compiled against the torch that will import it."""
    outside = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    errors = []
    for env in (os.environ, outside):
        run = subprocess.run([sys.executable, "-c", TORCH_QUERY], env=env, capture_output=True,
                             text=True)
        if run.returncode == 0:
            info = json.loads(run.stdout.strip().splitlines()[-1])
            print(f"grape: building against torch {info['version']} in {info['dir']}")
            return info
        errors.append((run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1])
    sys.exit(f"grape: torch is not importable from {sys.executable} ({errors[-1]}). Install torch "
             "first, then build with `pip install --no-build-isolation .`")


class CMakeBuild(build_ext):
    def run(self):
        # build_ext.run clears `inplace` while it builds; remember whether this build is in place
        # (`setup.py build_ext --inplace`, or an editable install).
        self.grape_inplace = bool(self.inplace or getattr(self, "editable_mode", False))
        super().run()

    def build_extension(self, ext):
        torch = query_torch()
        includes = torch["includes"] + cuda_library_includes(torch["dir"], nvcc_path=find_nvcc())
        torch_lib = os.path.join(torch["dir"], "lib")
        ext_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        build_dir = ROOT / "build" / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)

        nvcc = find_nvcc()
        with_cuda = os.environ.get("GRAPE_CUDA", "1") != "0" and torch["cuda"] is not None and nvcc
        # The GoogleTest binary is for development; a wheel leaves it out (and needs no GoogleTest).
        in_place = getattr(self, "grape_inplace", True)
        tests = os.environ.get("GRAPE_BUILD_TESTS", "1" if in_place else "0")
        args = [
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DGRAPE_TORCH_INCLUDE_DIRS={';'.join(includes)}",
            f"-DGRAPE_TORCH_LIBRARY_DIR={torch_lib}",
            f"-DGRAPE_CXX11_ABI={torch['cxx11_abi']}",
            f"-DGRAPE_EXTENSION_DIR={ROOT / 'grape'}",
            f"-DGRAPE_WITH_CUDA={'ON' if with_cuda else 'OFF'}",
            f"-DGRAPE_BUILD_TESTS={'OFF' if tests == '0' else 'ON'}",
            "-DCMAKE_BUILD_TYPE=Release",
        ]
        if with_cuda:
            args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
            args.append(f"-DCMAKE_CUDA_ARCHITECTURES={os.environ.get('GRAPE_CUDA_ARCHS', '80;90')}")
        if shutil.which("ninja") and not (build_dir / "Makefile").exists():
            args.append("-GNinja")
        subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build_dir), *args])
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", str(build_dir), "-j", jobs])
        # CMake writes _C next to the sources (so a plain CMake build is importable too); a wheel
        # build wants it in its own directory.
        built = ROOT / "grape" / os.path.basename(self.get_ext_filename(ext.name))
        target = Path(self.get_ext_fullpath(ext.name))
        if built.resolve() != target.resolve():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, target)


# Name, version and dependencies are in pyproject.toml.
setup(
    ext_modules=[CMakeExtension("grape._C")],
    cmdclass={"build_ext": CMakeBuild},
)
