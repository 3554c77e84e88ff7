"""Build of grape: setuptools calls CMake (CMakeLists.txt is the one description of the build).

    pip install --no-build-isolation -e .     # builds grape/_C and the C++ tests in build/cmake

torch must already be installed (the extension is compiled against it, hence no build isolation).
Environment: GRAPE_CUDA=0 builds without CUDA; GRAPE_CUDA_ARCHS="80;90" picks GPU architectures;
GRAPE_BUILD_TESTS=0 skips the GoogleTest binary; MAX_JOBS limits parallel compile jobs.
"""

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
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


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import torch
        import torch.utils.cpp_extension as cpp

        try:
            includes = cpp.include_paths(device_type="cuda")
        except TypeError:  # older torch
            includes = cpp.include_paths(cuda=True)
        includes = list(includes) + cuda_library_includes(os.path.dirname(torch.__file__), nvcc_path=find_nvcc())
        torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        ext_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        build_dir = ROOT / "build" / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)

        nvcc = find_nvcc()
        with_cuda = (
            os.environ.get("GRAPE_CUDA", "1") != "0" and torch.version.cuda is not None and nvcc
        )
        args = [
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DGRAPE_TORCH_INCLUDE_DIRS={';'.join(includes)}",
            f"-DGRAPE_TORCH_LIBRARY_DIR={torch_lib}",
            f"-DGRAPE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-DGRAPE_EXTENSION_DIR={ROOT / 'grape'}",
            f"-DGRAPE_WITH_CUDA={'ON' if with_cuda else 'OFF'}",
            f"-DGRAPE_BUILD_TESTS={'OFF' if os.environ.get('GRAPE_BUILD_TESTS') == '0' else 'ON'}",
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


setup(
    name="grape",
    version="0.1.0",
    description="CUDA graphs for dynamic PyTorch workloads",
    packages=find_packages(include=["grape", "grape.*"]),
    ext_modules=[CMakeExtension("grape._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    zip_safe=False,
)
