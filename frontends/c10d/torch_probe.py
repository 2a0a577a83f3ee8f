"""Tells meson how to build mep's c10d backend against the torch of the
Python running this script: one `key=value` a line (include, libdir, cxx11_abi,
cxx_std, version), and `problem=...` lines for what makes that torch unusable.
Exits 0 when torch is usable, 1 otherwise."""
import contextlib
import inspect
import io
import logging
import os
import re
import sys


def std_of(config: str) -> str:
    """The C++ standard torch was built with, from torch.__config__.show()."""
    m = re.search(r"C\+\+ Version:\s*(\d{6})", config)
    year = int(m.group(1)) // 100 if m else 2017
    return {2017: "c++17", 2020: "c++20", 2023: "c++23"}.get(year, "c++17")


def probe(out: list[str], problems: list[str]) -> None:
    try:
        import torch
    except Exception as e:  # any import failure means "no usable torch"
        out.append("version=none")
        problems.append(f"torch is not importable by {sys.executable}: {e}")
        return
    out.append(f"version={torch.__version__}")
    import torch.distributed as dist
    if not dist.is_available():
        problems.append("this torch is built without torch.distributed")
        return
    params = inspect.signature(dist.Backend.register_backend).parameters
    for name in ("extended_api", "devices"):
        if name not in params:
            problems.append(f"Backend.register_backend has no '{name}' "
                            "argument (torch too old)")
    # Ask torch itself where its headers and libraries are; it logs a
    # warning about CUDA on a machine without it, which is noise here.
    logging.disable(logging.WARNING)
    with contextlib.redirect_stderr(io.StringIO()):
        from torch.utils import cpp_extension
        incs = cpp_extension.include_paths()
        libs = cpp_extension.library_paths()
    for p in incs:
        out.append(f"include={p}")
    header = os.path.join(incs[0], "torch", "csrc", "distributed", "c10d",
                          "Backend.hpp")
    if not os.path.exists(header):
        problems.append(f"the C++ headers of c10d are missing ({header})")
    libdir = libs[0]
    out.append(f"libdir={libdir}")
    for lib in ("c10", "torch", "torch_cpu", "torch_python"):
        if not os.path.exists(os.path.join(libdir, f"lib{lib}.so")):
            problems.append(f"lib{lib}.so is missing from {libdir}")
    # CUDA: the version torch was built for, and whether the libraries the
    # CUDA build of the backend links are there (cuda_libs=1).
    cuda = torch.version.cuda or "none"
    out.append(f"cuda={cuda}")
    have = all(os.path.exists(os.path.join(libdir, f"lib{lib}.so"))
               for lib in ("c10_cuda", "torch_cuda"))
    out.append(f"cuda_libs={int(cuda != 'none' and have)}")
    out.append(f"cxx11_abi={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
    out.append(f"cxx_std={std_of(torch.__config__.show())}")


def main() -> int:
    out: list[str] = []
    problems: list[str] = []
    probe(out, problems)
    out += [f"problem={p}" for p in problems]
    print("\n".join(out))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
