"""HSV jitter and flips on the device batch (`--color-aug device`, data/color.py) give the model the same
pixels and labels as the loader workers' OpenCV path (augment.apply_color_hwc)."""

import cv2
import numpy as np
import pytest
import torch

from yolov5_smddp.data.augment import AugmentParams, apply_color_hwc, draw_color_params
from yolov5_smddp.data.color import apply_color, bgr_to_hsv, hsv_to_rgb, runs_on_device
from yolov5_smddp.data.dataset import YoloDataset
from yolov5_smddp.data.labels import build_label_index
from yolov5_smddp.data.loader import collate
from yolov5_smddp.data.synthetic import make_default_dataset
from yolov5_smddp.train.engine import prepare_images

_CV_CPU_AVX2, _CV_CPU_FMA3 = 11, 12  # OpenCV's CPU feature ids (cvdef.h); Python has no names for them


def _every_colour() -> np.ndarray:
    """uint8 [4096, 4096, 3]: each of the 2^24 three-byte values once."""
    v = np.arange(1 << 24, dtype=np.uint32)
    return np.stack([v >> 16, (v >> 8) & 255, v & 255], -1).astype(np.uint8).reshape(4096, 4096, 3)


def test_bgr_to_hsv_is_opencvs_on_every_colour():
    img = _every_colour()
    t = torch.from_numpy(img).int()
    h, s, v = bgr_to_hsv(t[..., 0], t[..., 1], t[..., 2])
    ours = torch.stack([h, s, v], -1).numpy()
    np.testing.assert_array_equal(ours, cv2.cvtColor(img, cv2.COLOR_BGR2HSV))


def test_hsv_to_rgb_is_opencvs_on_every_input():
    hsv = _every_colour()
    hsv[..., 0] %= 180
    t = torch.from_numpy(hsv).int()
    ours = hsv_to_rgb(t[..., 0], t[..., 1], t[..., 2]).permute(1, 2, 0).numpy().astype(int)
    diff = ours - cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB).astype(int)
    assert np.abs(diff).max() <= 1
    if cv2.checkHardwareSupport(_CV_CPU_AVX2) and cv2.checkHardwareSupport(_CV_CPU_FMA3):
        assert np.count_nonzero(diff) == 0  # OpenCV's vectorised loop with contracted multiply-adds
    else:  # a build without FMAs rounds `1 - s * t` twice: rare one-level differences
        assert np.count_nonzero(diff) < diff.size * 1e-3


def _worker_path(images, p: AugmentParams, rng) -> list[np.ndarray]:
    out = []
    for img in images:
        out.append(apply_color_hwc(img, draw_color_params(p, rng)))
    return out


@pytest.mark.parametrize(
    "hyp",
    [
        {"flipud": 0.5, "fliplr": 0.5},
        {"hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0, "flipud": 0.5},
        {"hsv_h": 0.5},
    ],
)
def test_apply_color_equals_the_worker_path(hyp):
    p = AugmentParams(**hyp)
    images = [np.random.default_rng(k).integers(0, 256, (64, 128, 3), dtype=np.uint8) for k in range(12)]
    expected = _worker_path(images, p, np.random.default_rng(5))
    rng = np.random.default_rng(5)
    params = torch.from_numpy(np.stack([draw_color_params(p, rng) for _ in images]))
    assert params.dtype == torch.float64 and params.shape == (12, 6)
    assert set(params[:, 4].tolist()) <= {0.0, 1.0} and set(params[:, 5].tolist()) <= {0.0, 1.0}
    if hyp.get("flipud"):
        assert params[:, 4].any() and not params[:, 4].all()  # both branches taken in this draw
    batch = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2)  # BGR, channels-last strides
    out = apply_color(batch, params)
    assert out.dtype == torch.uint8 and out.is_contiguous(memory_format=torch.channels_last)
    np.testing.assert_array_equal(out.permute(0, 2, 3, 1).numpy(), np.stack(expected))


def _items(tmp_path, color_on_device: bool, n: int = 6):
    data = make_default_dataset(tmp_path / "data", n_train=8, n_val=2, imgsz=128, seed=4)
    index = build_label_index(
        [tmp_path / "data" / "images" / "train"], nc=3, root=tmp_path / "data", cache_dir=tmp_path / "c"
    )
    assert data.is_file()
    hyp = {"flipud": 0.5, "fliplr": 0.5}
    ds = YoloDataset(
        index, 128, augment=True, hyp=AugmentParams(**hyp), seed=11, color_on_device=color_on_device
    )
    return [ds[i % len(ds)] for i in range(n)]


def test_dataset_items_with_color_on_device_train_on_the_same_pixels_and_labels(tmp_path):
    on_workers = _items(tmp_path, False)
    deferred = _items(tmp_path, True)
    assert all(item[4] is None for item in on_workers)
    imgs_w, targets_w, _, _, color_w = collate(on_workers)
    imgs_d, targets_d, _, _, color_d = collate(deferred)
    assert color_w is None and color_d.shape == (6, 6) and color_d.dtype == torch.float64
    assert color_d[:, 4:].any()  # some flips happened in this draw
    torch.testing.assert_close(targets_d, targets_w, rtol=0, atol=0)  # labels flipped in the workers
    assert not torch.equal(imgs_d, imgs_w)  # BGR, unjittered, unflipped ...
    torch.testing.assert_close(apply_color(imgs_d, color_d), imgs_w, rtol=0, atol=0)  # ... until the batch
    x = prepare_images(imgs_d, torch.device("cpu"), channels_last=True, color=color_d)
    torch.testing.assert_close(x, imgs_w.float() / 255, rtol=0, atol=0)


def test_validation_items_never_defer(tmp_path):
    data = make_default_dataset(tmp_path / "data", n_train=4, n_val=2, imgsz=64, seed=1)
    index = build_label_index(
        [tmp_path / "data" / "images" / "val"], nc=3, root=data.parent, cache_dir=tmp_path / "c"
    )
    ds = YoloDataset(index, 64, augment=False, hyp=None, color_on_device=True)
    assert ds.color_on_device is False and ds[0][4] is None


@pytest.mark.parametrize(
    ("mode", "device_type", "expected"),
    [
        ("auto", "cuda", True),
        ("auto", "cpu", False),
        ("device", "cpu", True),
        ("device", "cuda", True),
        ("workers", "cuda", False),
        ("workers", "cpu", False),
    ],
)
def test_where_color_runs(mode, device_type, expected):
    assert runs_on_device(mode, device_type) is expected


def test_the_memory_format_is_the_callers_choice():
    """`--channels-last off` feeds NCHW memory (the loader's batches are channels-last), on: channels-last;
    apply_color keeps the format it is given."""
    rng = np.random.default_rng(3)
    batch = torch.from_numpy(rng.integers(0, 256, (2, 32, 48, 3), dtype=np.uint8)).permute(0, 3, 1, 2)
    assert batch.is_contiguous(memory_format=torch.channels_last)  # as collate makes them
    params = torch.tensor(
        [[1.1, 0.9, 1.2, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]], dtype=torch.float64
    )
    nchw = batch.contiguous()
    assert apply_color(nchw, params).is_contiguous()
    assert apply_color(batch, params).is_contiguous(memory_format=torch.channels_last)
    cpu = torch.device("cpu")
    for color in (None, params):
        off = prepare_images(batch, cpu, channels_last=False, color=color)
        on = prepare_images(batch, cpu, channels_last=True, color=color)
        kept = prepare_images(nchw, cpu, channels_last=None, color=color)
        assert off.is_contiguous() and not off.is_contiguous(memory_format=torch.channels_last)
        assert on.is_contiguous(memory_format=torch.channels_last) and not on.is_contiguous()
        assert kept.is_contiguous()
        torch.testing.assert_close(off, on, rtol=0, atol=0)
        torch.testing.assert_close(kept, on, rtol=0, atol=0)
        assert off.dtype == torch.float32 and float(off.max()) <= 1.0
