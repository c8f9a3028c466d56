"""Stand-in only: make Debian's torch (built without libuv) create every TCPStore without libuv.

setup.sh installs this module into the stand-in's site-packages with a .pth file that imports it, so it runs at
the start of EVERY Python process in the image, whatever started it and whatever environment it got:

- the ranks that the toolkit's `mpirun` starts over ssh (SMDDP distribution) receive only mpirun's `-x`
  variables and /etc/environment, not the image's `ENV USE_LIBUV=0`;
- the toolkit's `torchrun` (torch_distributed) creates its rendezvous TCPStore with the libuv default and
  ignores USE_LIBUV altogether.

Both then fail with "use_libuv was requested but PyTorch was build without libuv support". The AWS DLC's torch
has libuv, so none of this belongs in the project's image or code: it models the DLC, where the request works.

What it does: sets USE_LIBUV=0 unless already set (read by torch's env:// store and by yolov5_smddp), and once
`torch.distributed` has been imported replaces its TCPStore by a subclass that always passes use_libuv=False.
Nothing imports torch early: a Python process that never imports torch.distributed pays for one finder.
"""

from __future__ import annotations

import os
import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec, PathFinder

PATCHED_MODULE = "torch.distributed"
USE_LIBUV_INDEX = 8  # TCPStore(host, port, world_size, is_master, timeout, wait, multi_tenant, fd, use_libuv)


def without_libuv(store_class: type) -> type:
    """A subclass of torch's TCPStore whose every instance is made with use_libuv=False."""

    class TCPStore(store_class):
        __doc__ = store_class.__doc__

        def __init__(self, *args, **kwargs):
            if len(args) > USE_LIBUV_INDEX:
                args = (*args[:USE_LIBUV_INDEX], False, *args[USE_LIBUV_INDEX + 1 :])
            else:
                kwargs["use_libuv"] = False
            super().__init__(*args, **kwargs)

    TCPStore.__module__ = store_class.__module__
    return TCPStore


def patch(module) -> None:
    store_class = getattr(module, "TCPStore", None)  # absent where torch.distributed is not available
    if store_class is not None and not getattr(store_class, "_standin_without_libuv", False):
        module.TCPStore = without_libuv(store_class)
        module.TCPStore._standin_without_libuv = True


class _PatchAfterImport(MetaPathFinder):
    """Finds torch.distributed as the path finder would, and patches it once its code has run."""

    def find_spec(self, fullname, path, target=None) -> ModuleSpec | None:
        if fullname != PATCHED_MODULE:
            return None
        spec = PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module_code = spec.loader.exec_module

        def exec_module(module) -> None:
            run_module_code(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    os.environ.setdefault("USE_LIBUV", "0")
    if PATCHED_MODULE in sys.modules:
        patch(sys.modules[PATCHED_MODULE])
    elif not any(isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())


install()
