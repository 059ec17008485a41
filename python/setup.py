# Builds braid_torch._C against the torch installed beside it (C++20, torch's own C++ ABI flags).
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

here = os.path.dirname(os.path.abspath(__file__))
include = os.path.join(os.path.dirname(here), "include")
if not os.path.isdir(os.path.join(include, "braid")):
    raise SystemExit(f"braid-torch: braid's headers are not at {include}: build from a braid checkout (pip install ./python)")

csrc = "braid_torch/csrc"
sources = [f"{csrc}/{f}" for f in sorted(os.listdir(os.path.join(here, csrc))) if f.endswith(".cpp")]
opt = os.environ.get("BRAID_TORCH_OPT", "-O2")

setup(
    ext_modules=[
        CppExtension(
            "braid_torch._C",
            sources,
            include_dirs=[include],
            extra_compile_args=["-std=c++20", opt, "-g0", "-Wall", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
