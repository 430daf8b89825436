"""tide from Python: run, plan and train LLaMA-style models bigger than device memory.

    import tide
    with tide.Model("tests/fixtures/hf-text") as m:
        print(m.generate("Once upon a time", max_new_tokens=8).text)

The API is documented in docs/python.md. The package binds libtide's C API
(include/tide.h) with ctypes and carries libtide.so, the `tide` program and
the hardware profiles.
"""

from ._lib import LIBRARY_PATH, lib as _l
from ._errors import DeviceError, Error, InfeasibleBudget, InvalidInput, IOError, OutOfMemory
from ._model import Generation, Model, cache_dir
from ._cli import executable, main, plan, train

__version__ = _l.tide_version().decode()

__all__ = ["Model", "Generation", "plan", "train", "Error", "InvalidInput", "OutOfMemory", "IOError",
           "InfeasibleBudget", "DeviceError", "cache_dir", "executable", "main", "LIBRARY_PATH",
           "__version__"]
