"""Has CUDA already started in this process? Then CUDA_VISIBLE_DEVICES is read and fixed.

CUDA reads CUDA_VISIBLE_DEVICES once, when the driver initialises (`cuInit`).
That happens on the first CUDA call of any framework, and some calls that
look harmless make it: `torch.cuda.is_available()` is one. Two checks, both
without importing anything heavy: torch's own flag when torch is loaded, and
the driver itself when libcuda is loaded.
"""

from __future__ import annotations

import ctypes
import os
import sys

_CUDA_SUCCESS = 0


def cuda_initialized() -> str | None:
    """Who initialised CUDA in this process, or `None` if nobody did yet."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "torch has initialised CUDA"
    if _driver_initialized():
        return "the CUDA driver is initialised"
    return None


def _driver_initialized() -> bool:
    try:
        # RTLD_NOLOAD: only find the copy already loaded, never load one (OSError: none is).
        driver = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return False
    count = ctypes.c_int()
    # Before cuInit every driver call answers CUDA_ERROR_NOT_INITIALIZED.
    return bool(driver.cuDeviceGetCount(ctypes.byref(count)) == _CUDA_SUCCESS)
