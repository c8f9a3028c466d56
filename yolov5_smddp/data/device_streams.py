"""The device decode, ordered against the training step (issue 52).

torchvision's `decode_jpeg(device="cuda")` allocates its outputs on the caller's current stream, but nvJPEG
writes them from a stream of its own that does not wait for the caller's queued kernels. The training loop
queues forward, backward and optimizer kernels without a host sync between log steps, so the caching
allocator may hand the decoder a block that a queued kernel of the previous step still reads or writes:
silently corrupted batches (pytorch/vision PR 9606, pytorch/torchcodec PR 1634).

`ordered_decode` runs the decode on a side stream instead:
1. the side stream waits for everything queued on the consumer stream so far (`wait_stream`);
2. the decoder's outputs are allocated on the side stream, whose blocks no consumer kernel is using (the
   caching allocator reuses a block only on the stream that freed it, and each block handed to the consumer
   is marked with `record_stream`, so it returns to the side stream only after the consumer's work on it);
3. the consumer stream waits for the side stream before it reads the outputs.
No host sync is added. Off CUDA the decode runs as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


class DecodeStreams:
    """One side stream per device for the decode (created on first use). `cuda` is the module that gives
    streams (torch.cuda; a recording stand-in in the tests)."""

    def __init__(self, device: torch.device, cuda: Any = None) -> None:
        self.device = torch.device(device)
        self.cuda = torch.cuda if cuda is None else cuda
        self._side = None

    @property
    def active(self) -> bool:
        return self.device.type == "cuda"

    def side(self):
        if self._side is None:
            self._side = self.cuda.Stream(device=self.device)
        return self._side

    def run(self, decode: Callable[[], Sequence[torch.Tensor | None]]) -> list[torch.Tensor | None]:
        """`decode()` (a list of tensors, None for a file it refused) on the side stream, ordered after the
        consumer's queued work and before the consumer's next use of the outputs."""
        if not self.active:
            return list(decode())
        consumer = self.cuda.current_stream(self.device)
        side = self.side()
        side.wait_stream(consumer)  # the inputs and every queued kernel of the step come first
        with self.cuda.stream(side):
            out = list(decode())
        for tensor in out:
            if tensor is not None:
                tensor.record_stream(consumer)  # freed blocks wait for the consumer's use
        consumer.wait_stream(side)  # the consumer reads the outputs only once they are written
        return out


def ordered_decode(
    decode: Callable[[], Sequence[torch.Tensor | None]], device: torch.device, cuda: Any = None
) -> list[torch.Tensor | None]:
    """`DecodeStreams(device, cuda).run(decode)` for a one-off call (a new side stream each time)."""
    return DecodeStreams(device, cuda).run(decode)
