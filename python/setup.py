# Builds braid_torch._C against the torch installed beside it (C++20, torch's own C++ ABI flags).
#
# With CUDA where the torch beside it has CUDA and nvcc is found (CUDA_HOME, or nvcc on PATH) with
# the major version torch was built with; BRAID_TORCH_CUDA=0 builds for CPU tensors only, =1 fails
# when CUDA cannot be built. The device code is built for TORCH_CUDA_ARCH_LIST (default 9.0).
# BRAID_TORCH_DEVICE_CODE=check compiles the CUDA sources to prove they build, not to run fast: PTX only
# (no ptxas), cicc and the host side at -O0. scripts/test-torch.sh sets it where no GPU is visible:
# cuda_path.cu took 442 s (cicc 175, ptxas 161, host 99) against 58 s so (2-vCPU Xeon VM).
import os
import re
import subprocess

from setuptools import setup
from torch.utils import cpp_extension
from torch.utils.cpp_extension import BuildExtension, CppExtension

here = os.path.dirname(os.path.abspath(__file__))
include = os.path.join(os.path.dirname(here), "include")
if not os.path.isdir(os.path.join(include, "braid")):
    raise SystemExit(f"braid-torch: braid's headers are not at {include}: build from a braid checkout (pip install ./python)")

csrc = "braid_torch/csrc"
opt = os.environ.get("BRAID_TORCH_OPT", "-O2")
cuda_only = {"backend_cuda.cpp", "cuda_path.cu"}
cpu_only = {"no_cuda.cpp"}


def nvcc_major():
    home = cpp_extension.CUDA_HOME
    if not home:
        return None
    try:
        out = subprocess.run([os.path.join(home, "bin", "nvcc"), "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.search(r"release (\d+)\.", out)
    return int(m.group(1)) if m else None


def want_cuda():
    import torch

    choice = os.environ.get("BRAID_TORCH_CUDA", "")
    if choice == "0":
        return False
    why = None
    if not torch.version.cuda:
        why = "this torch has no CUDA"
    elif nvcc_major() is None:
        why = "nvcc was not found (set CUDA_HOME)"
    elif nvcc_major() != int(torch.version.cuda.split(".")[0]):
        why = f"nvcc {nvcc_major()}.x differs from the CUDA {torch.version.cuda} torch was built with"
    if why and choice == "1":
        raise SystemExit(f"braid-torch: BRAID_TORCH_CUDA=1 but {why}")
    if why:
        print(f"braid-torch: building for CPU tensors only: {why}")
    return why is None


cuda = want_cuda()
names = sorted(f for f in os.listdir(os.path.join(here, csrc)) if f.endswith((".cpp", ".cu")))
names = [f for f in names if f not in (cpu_only if cuda else cuda_only | {f for f in names if f.endswith(".cu")})]
sources = [f"{csrc}/{f}" for f in names]
cxx = ["-std=c++20", opt, "-g0", "-Wall", "-Wno-unused-parameter", "-Wno-interference-size"]

if cuda:
    from torch.utils.cpp_extension import CUDAExtension

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    nvcc = ["-std=c++20", opt, "--expt-relaxed-constexpr"]
    device_code = os.environ.get("BRAID_TORCH_DEVICE_CODE", "")
    if device_code == "check":
        # An arch flag of our own: torch then adds none of its TORCH_CUDA_ARCH_LIST ones.
        archs = [a for a in re.split(r"[ ;]+", os.environ["TORCH_CUDA_ARCH_LIST"]) if a]
        nvcc = ["-std=c++20", "-O0", "--expt-relaxed-constexpr", "-Xcicc", "-O0"]
        for a in archs:
            num = a.replace("+PTX", "").replace(".", "")
            nvcc.append(f"-gencode=arch=compute_{num},code=compute_{num}")
        print(f"braid-torch: BRAID_TORCH_DEVICE_CODE=check: device code as PTX at -O0 ({', '.join(archs)}), to check that it builds")
    elif device_code:
        raise SystemExit(f"braid-torch: BRAID_TORCH_DEVICE_CODE='{device_code}': the one value is 'check' (unset builds the device code to run)")
    ext = CUDAExtension(
        "braid_torch._C",
        sources,
        include_dirs=[include],
        define_macros=[("BRAID_TORCH_CUDA", "1")],
        extra_compile_args={"cxx": cxx, "nvcc": nvcc},
    )
else:
    ext = CppExtension("braid_torch._C", sources, include_dirs=[include], extra_compile_args=cxx)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)})
