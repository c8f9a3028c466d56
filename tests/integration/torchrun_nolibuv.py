"""`python -m tests.integration.torchrun_nolibuv ...` = `torchrun ...` for torch builds without libuv.

Debian's torch 2.6 (the dev image) is built without libuv, yet torchrun's rendezvous creates its
TCPStore with the libuv default and fails ("use_libuv was requested but PyTorch was build without
libuv support") whatever USE_LIBUV says. This wrapper makes TCPStore default to use_libuv=False and
then runs torchrun's own main, so the tests exercise the real elastic launcher.
"""

import sys

import torch.distributed as dist


class _TCPStoreWithoutLibuv(dist.TCPStore):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("use_libuv", False)
        super().__init__(*args, **kwargs)


dist.TCPStore = _TCPStoreWithoutLibuv

from torch.distributed import run  # noqa: E402  (must see the patched TCPStore)

if __name__ == "__main__":
    sys.argv[0] = "torchrun"
    sys.exit(run.main())
