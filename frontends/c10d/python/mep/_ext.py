"""mep._C, the c10d extension, loaded at its first use and only where it was
built for this Python and this torch.

A C++ extension is bound to the exact torch it was compiled against (its
ABI changes between releases and between CUDA and CPU builds): loading it
into another one fails with undefined symbols at best and crashes at worst.
So the torch version recorded at build time (_build_info) is compared with
the running one before the extension is ever loaded.
"""
import importlib
import sys
import threading

import torch

from . import _build_info

_lock = threading.Lock()
_module = None


def problem():
    """Why the "mep" backend cannot be used by this process (a sentence),
    or None when it can."""
    bi = _build_info
    if not bi.C10D_BUILT:
        return f"this mep was built without the c10d backend: {bi.C10D_WHY}"
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if here != bi.PYTHON_VERSION:
        return (f"this mep was built for Python {bi.PYTHON_VERSION}, "
                f"this is Python {here} ({sys.executable})")
    if str(torch.__version__) != bi.TORCH_VERSION:
        return (f"this mep was built against torch {bi.TORCH_VERSION}, "
                f"this Python has torch {torch.__version__}; rebuild mep against "
                "it: pip install --no-build-isolation --force-reinstall --no-deps "
                "<mep's source> (docs/install.md)")
    return None


def load():
    """The extension module; RuntimeError with the reason when it cannot be
    used here."""
    global _module
    with _lock:
        if _module is None:
            why = problem()
            if why:
                raise RuntimeError(f"mep: the 'mep' backend is not available: {why}")
            _module = importlib.import_module("mep._C")
        return _module
