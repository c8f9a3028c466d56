"""data.device_streams: the device decode ordered against the queued training step (issue 52, item 1).

No GPU here: a recording stand-in for torch.cuda's stream API shows the order of the calls, which is what
keeps nvJPEG's writes off memory the step's queued kernels still use. bench/gpu_all.sh checks the pixels on
a GPU (decode while a training step is queued, every image against the CPU decode)."""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from yolov5_smddp.data.device_streams import DecodeStreams, ordered_decode


class _Stream:
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: _Stream) -> None:
        self.log.append(("wait", self.name, other.name))


class _Cuda:
    """torch.cuda's stream surface, recording each call."""

    def __init__(self) -> None:
        self.log: list = []
        self.current = _Stream("consumer", self.log)
        self.created = 0

    def Stream(self, device=None):  # noqa: N802 - torch.cuda's name
        self.created += 1
        return _Stream("side", self.log)

    def current_stream(self, device=None):
        return self.current

    @contextlib.contextmanager
    def stream(self, s: _Stream):
        previous, self.current = self.current, s
        self.log.append(("enter", s.name))
        try:
            yield
        finally:
            self.current = previous
            self.log.append(("exit", s.name))


class _Out:
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def record_stream(self, stream: _Stream) -> None:
        self.log.append(("record", self.name, stream.name))


def test_the_decode_runs_on_a_side_stream_after_the_queued_step_and_before_its_next_use():
    cuda = _Cuda()
    streams = DecodeStreams(torch.device("cuda", 0), cuda)

    def decode():
        cuda.log.append(("decode on", cuda.current.name))
        return [_Out("a", cuda.log), None, _Out("b", cuda.log)]

    out = streams.run(decode)
    assert [o if o is None else o.name for o in out] == ["a", None, "b"]
    assert cuda.log == [
        ("wait", "side", "consumer"),  # the step's queued kernels come first
        ("enter", "side"),
        ("decode on", "side"),  # outputs allocated on the side stream's blocks
        ("exit", "side"),
        ("record", "a", "consumer"),  # a freed output waits for the consumer's use
        ("record", "b", "consumer"),
        ("wait", "consumer", "side"),  # the consumer reads them once written
    ]
    streams.run(decode)
    assert cuda.created == 1  # one side stream per batcher, reused


def test_off_cuda_the_decode_runs_as_it_is():
    cuda = _Cuda()
    called = []
    out = ordered_decode(lambda: called.append(1) or [torch.zeros(1)], torch.device("cpu"), cuda)
    assert called == [1] and len(out) == 1 and cuda.log == [] and cuda.created == 0


def test_the_gpu_batcher_decodes_through_its_streams(monkeypatch):
    from yolov5_smddp.data import gpu_batch
    from yolov5_smddp.data.bytes_dataset import TileSource

    batcher = gpu_batch.GpuBatcher("cpu")
    calls = []
    original = batcher.streams.run
    monkeypatch.setattr(batcher.streams, "run", lambda decode: calls.append(1) or original(decode))
    ok, jpeg = __import__("cv2").imencode(".jpg", np.full((16, 16, 3), 80, np.uint8))
    assert ok
    tile = TileSource.__new__(TileSource)
    object.__setattr__(tile, "data", jpeg.reshape(-1))
    out = batcher._decode_group([tile])
    assert calls == [1] and out[0].shape == (3, 16, 16)


def test_gpu_loader_counts_only_the_host_wait_as_waiting(monkeypatch):
    """Issue 52 item 5: the device decode/augment run inside next(loader) is device work, not a wait on
    the host; the training loop subtracts it (pop_issue_seconds) from its data_wait."""
    import time

    from yolov5_smddp.data import gpu_batch

    class _Inner:
        dataset = None
        collate_fn = None

        def __iter__(self):
            for i in range(3):
                time.sleep(0.02)  # the workers
                yield i

        def __len__(self):
            return 3

    class _Batcher:
        def assemble(self, batch):
            time.sleep(0.06)  # the device decode and augmentation being issued
            return batch

    loader = gpu_batch.GpuLoader(_Inner(), "cpu")
    loader.batcher = _Batcher()
    loader._reported = True
    assert list(loader) == [0, 1, 2]
    issued = loader.pop_issue_seconds()
    assert loader.host_wait_s >= 0.05 and issued >= 0.17  # 3 x 20 ms waited, 3 x 60 ms issued
    assert loader.host_wait_s < issued  # the issue time is not in the wait (sleeps only ever run long)
    assert loader.pop_issue_seconds() == 0.0
