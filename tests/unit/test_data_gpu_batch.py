"""The GPU data path (`--loader gpu`, data.bytes_dataset + data.gpu_batch) on the CPU device: the boxes
and every random draw are the CPU path's for the same seed, exactly; the pixels are the CPU path's
within the measured bounds per stage (data.gpu_batch.PIXEL_BOUNDS), and exactly where no interpolation
happens (an integer-shift mosaic); files the device does not take are decoded on the CPU; a corrupt
file is named and handled; nothing is written under the dataset."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from datatree import scrambled_jpeg, tree_state
from jpegs import photo, pil_jpeg
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

from yolov5_smddp.data import gpu_batch
from yolov5_smddp.data.augment import AugmentParams, random_affine_matrix
from yolov5_smddp.data.bytes_dataset import BytesDataset, device_decodable
from yolov5_smddp.data.color import apply_color
from yolov5_smddp.data.dataset import YoloDataset
from yolov5_smddp.data.gpu_batch import PIXEL_BOUNDS, GpuBatcher, collate_plans, resize_like_cpu, warp_batch
from yolov5_smddp.data.labels import build_label_index
from yolov5_smddp.data.synthetic import make_default_dataset
from yolov5_smddp.errors import DataError

IMGSZ = 160
HYPS = {
    "default": {},
    "affine": {"degrees": 10.0, "shear": 5.0, "translate": 0.2, "scale": 0.9},
    "perspective": {"perspective": 0.0008, "degrees": 5.0},
    "letterbox": {"mosaic": 0.0, "degrees": 3.0},
    "half_mosaic_mixup": {"mosaic": 0.5, "mixup": 1.0, "flipud": 0.5},
}
SHIFT_ONLY = {"scale": 0.0, "translate": 0.0, "flipud": 0.5}
"""The affine is then a whole-pixel shift of the canvas (s = 1, no rotation, shear or perspective): the
warp interpolates nothing, so both paths must give the same pixels exactly."""


def _stats(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    d = np.abs(a.astype(np.int64) - b.astype(np.int64))
    return float(d.mean()), int(d.max())


def _within(stats: tuple[float, int], stage: str, margin: float = 1.25) -> None:
    mean, peak = PIXEL_BOUNDS[stage]
    assert stats[0] <= mean * margin + 1e-9 and stats[1] <= max(peak * margin, peak + 1), (stage, stats)


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu")
    yaml_path = make_default_dataset(tmp / "d", n_train=12, n_val=0, imgsz=IMGSZ, seed=3)
    return build_label_index(
        [yaml_path.parent / "images" / "train"], nc=3, root=yaml_path.parent, cache_dir=tmp / "c"
    )


def _pair(index, hyp, seed=5):
    cpu = YoloDataset(
        index,
        IMGSZ,
        augment=True,
        hyp=AugmentParams(**hyp),
        seed=seed,
        color_on_device=True,
        region_decode=False,
    )
    return cpu, BytesDataset(index, IMGSZ, augment=True, hyp=AugmentParams(**hyp), seed=seed)


def _cpu_batch(items) -> torch.Tensor:
    imgs = torch.from_numpy(np.stack([it[0].transpose(1, 2, 0) for it in items])).permute(0, 3, 1, 2)
    return apply_color(imgs, torch.from_numpy(np.stack([it[4] for it in items])))


@pytest.mark.parametrize("name", sorted(HYPS))
def test_boxes_and_draws_equal_the_cpu_path(index, name):
    cpu, gpu = _pair(index, HYPS[name])
    for i in range(10):
        a, g = cpu[i], gpu[i]
        assert np.array_equal(a[1], g[1]), (name, i)  # targets, bit for bit
        assert np.array_equal(a[4], g[4])  # HSV gains and flips
        assert a[2] == g[2] and a[3] == g[3]  # path and shapes (letterbox)
        assert len(g[5]) == len(g[1])
    assert cpu.rng.random() == gpu.rng.random()  # the same number of draws, in the same order


def test_shift_only_mosaic_pixels_are_the_cpu_paths_exactly(index):
    cpu, gpu = _pair(index, SHIFT_ONLY)
    items_c, items_g = [cpu[i] for i in range(8)], [gpu[i] for i in range(8)]
    got, targets = GpuBatcher("cpu").assemble(collate_plans(items_g))[:2]
    assert got.dtype == torch.uint8 and got.shape == (8, 3, IMGSZ, IMGSZ)
    assert torch.equal(got, _cpu_batch(items_c))  # mosaic placement and flips exact, RGB
    assert torch.equal(
        targets[:, 0], torch.cat([torch.full((len(it[1]),), float(b)) for b, it in enumerate(items_c)])
    )


@pytest.mark.parametrize("name", sorted(HYPS))
def test_sample_pixels_within_the_interpolation_bound(index, name):
    cpu, gpu = _pair(index, HYPS[name])
    items_c, items_g = [cpu[i] for i in range(8)], [gpu[i] for i in range(8)]
    got = GpuBatcher("cpu").assemble(collate_plans(items_g))[0]
    mean, peak = _stats(got.numpy(), _cpu_batch(items_c).numpy())
    assert mean <= 0.15 and peak <= 40, (
        name,
        mean,
        peak,
    )  # measured: mean <= 0.08, max <= 23 (HSV-amplified)


def test_decode_stage_is_exact_on_the_cpu_device():
    for w, h in ((640, 480), (333, 500)):
        data = pil_jpeg(photo(w, h, 1), quality=90)
        ref = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        got = decode_jpeg([torch.frombuffer(bytearray(data), dtype=torch.uint8)], mode=ImageReadMode.RGB)[0]
        _within(_stats(got.flip(0).permute(1, 2, 0).numpy(), ref), "decode")


@pytest.mark.parametrize(
    ("wh", "stage"), [((333, 500), "resize"), ((640, 480), "decode"), ((1280, 960), "resize_reduced")]
)
def test_resize_stage_within_its_bound(wh, stage):
    w, h = wh
    data = pil_jpeg(photo(w, h, 1), quality=90)
    r = 640 / max(w, h)
    hw = (max(round(h * r), 1), max(round(w * r), 1))
    reduce = 2 if max(w, h) >= 1280 else 1
    flag = cv2.IMREAD_REDUCED_COLOR_2 if reduce == 2 else cv2.IMREAD_COLOR
    ref = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    if ref.shape[:2] != hw:
        ref = cv2.resize(ref, hw[::-1], interpolation=cv2.INTER_LINEAR)
    rgb = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    got = resize_like_cpu(rgb, reduce, hw).flip(0).permute(1, 2, 0).numpy()
    _within(_stats(got, ref), stage)


@pytest.mark.parametrize("perspective", [0.0, 0.0008])
@pytest.mark.parametrize("content", ["photo", "noise"])
def test_warp_stage_within_its_bound(perspective, content):
    rng = np.random.default_rng(1)
    src = photo(640, 640, 2) if content == "photo" else rng.integers(0, 256, (640, 640, 3), dtype=np.uint8)
    p = AugmentParams(degrees=10.0, shear=5.0, perspective=perspective)
    m, _ = random_affine_matrix((640, 640), (320, 320), p, rng)
    if perspective:
        ref = cv2.warpPerspective(src, m, (320, 320), flags=cv2.INTER_LINEAR, borderValue=(114,) * 3)
    else:
        ref = cv2.warpAffine(src, m[:2], (320, 320), flags=cv2.INTER_LINEAR, borderValue=(114,) * 3)
    got = warp_batch(torch.from_numpy(src).permute(2, 0, 1)[None], m[None], (320, 320))[0]
    _within(_stats(got.permute(1, 2, 0).numpy(), ref), f"warp_{content}")


def _exif_rotated(data: bytes) -> bytes:
    tiff = b"MM\x00\x2a\x00\x00\x00\x08\x00\x01\x01\x12\x00\x03\x00\x00\x00\x01\x00\x06\x00\x00" + b"\x00" * 4
    app1 = b"Exif\x00\x00" + tiff
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + data[2:]


def _odd_files(folder: Path) -> dict[str, bytes]:
    img = photo(IMGSZ, 120, 9)
    grey = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_BGR2GRAY))[1].tobytes()
    cmyk = Path(folder) / "cmyk.jpg"
    Image.new("CMYK", (IMGSZ, 120), (30, 120, 200, 10)).save(cmyk)
    return {
        "png.png": cv2.imencode(".png", img)[1].tobytes(),
        "grey.jpg": grey,
        "cmyk.jpg": cmyk.read_bytes(),
        "exif.jpg": _exif_rotated(pil_jpeg(photo(120, IMGSZ, 4), quality=90)),
        "progressive.jpg": pil_jpeg(photo(IMGSZ, 100, 5), quality=90, progressive=True),
    }


def test_which_files_the_device_decodes(tmp_path):
    assert device_decodable(pil_jpeg(photo(64, 48, 1), quality=90))
    assert device_decodable(cv2.imencode(".jpg", photo(64, 48, 1))[1].tobytes())
    assert not device_decodable(pil_jpeg(photo(64, 48, 1), quality=90, progressive=True))  # the workers'
    for name, data in _odd_files(tmp_path).items():
        assert not device_decodable(data), name
    assert not device_decodable(b"\xff\xd8\xff")


@pytest.fixture()
def odd_index(tmp_path):
    root = tmp_path / "odd"
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    files = {f"jpg{k}.jpg": pil_jpeg(photo(IMGSZ, 120, k), quality=90) for k in range(4)}
    files |= _odd_files(tmp_path)
    for name, data in files.items():
        (root / "images" / name).write_bytes(data)
        (root / "labels" / name).with_suffix(".txt").write_text("0 0.5 0.5 0.4 0.3\n1 0.3 0.6 0.2 0.2\n")
    return build_label_index([root / "images"], nc=2, root=root, cache_dir=tmp_path / "cache")


def test_png_grey_cmyk_and_exif_files_are_decoded_on_the_cpu_with_the_cpu_paths_pixels(odd_index):
    cpu, gpu = _pair(odd_index, SHIFT_ONLY, seed=2)
    before = tree_state(odd_index.root)
    n = len(cpu)
    items_c, items_g = [cpu[i] for i in range(n)], [gpu[i] for i in range(n)]
    batcher = GpuBatcher("cpu")
    got = batcher.assemble(collate_plans(items_g))[0]
    assert torch.equal(got, _cpu_batch(items_c))
    odd = {"png.png", "grey.jpg", "cmyk.jpg", "exif.jpg", "progressive.jpg"}
    tiles = [t for it in items_g for t in it[0].first.tiles]
    assert all((t.pixels is not None) == (Path(t.path).name in odd) for t in tiles)  # CPU-decoded: those
    assert odd <= {Path(t.path).name for t in tiles}  # and every kind was met
    assert batcher.stats.worker_pixels >= 1 and batcher.stats.fallback_decodes == 0
    assert tree_state(odd_index.root) == before  # nothing written under the dataset


def test_a_file_the_batched_decode_refuses_is_decoded_on_the_cpu_and_counted(index, monkeypatch, caplog):
    cpu, gpu = _pair(index, SHIFT_ONLY)
    items_c, items_g = [cpu[i] for i in range(4)], [gpu[i] for i in range(4)]
    refused = items_g[0][0].first.tiles[0].data.tobytes()
    real = gpu_batch.decode_jpeg

    def picky(data, **kwargs):  # the device decoder refusing one file (as nvJPEG may, e.g. an odd JPEG)
        batch = data if isinstance(data, list) else [data]
        if any(bytes(t.numpy()) == refused for t in batch):
            raise RuntimeError("nvjpegDecodeBatched failed: 6")
        return real(data, **kwargs)

    monkeypatch.setattr(gpu_batch, "decode_jpeg", picky)
    batcher = GpuBatcher("cpu")
    with caplog.at_level(logging.INFO, logger="yolov5_smddp.data.gpu_batch"):
        got = batcher.assemble(collate_plans(items_g))[0]
        batcher.assemble(collate_plans(items_g))
    assert torch.equal(got, _cpu_batch(items_c))  # the CPU decode is the CPU path's own
    assert batcher.stats.fallback_decodes == 2  # one per batch
    assert len([r for r in caplog.records if "decoded on the CPU" in r.getMessage()]) == 1  # logged once


def _four_photos(root, cache_dir):
    """root/images/{0..3}.jpg (photo-like, quality 90), one centred box each; their scanned index."""
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    for k in range(4):
        (root / "images" / f"{k}.jpg").write_bytes(pil_jpeg(photo(IMGSZ, IMGSZ, k), quality=90))
        (root / "labels" / f"{k}.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    return build_label_index([root / "images"], nc=1, root=root, cache_dir=cache_dir)


def test_a_corrupt_jpeg_is_named_its_tile_grey_and_its_boxes_dropped(tmp_path, caplog):
    root = tmp_path / "c"
    idx = _four_photos(root, tmp_path / "cache")
    bad = root / "images" / "2.jpg"
    bad.write_bytes(scrambled_jpeg())  # changed since the scan: the header is fine, the data is not
    before = tree_state(root)
    gpu = BytesDataset(
        idx, IMGSZ, augment=True, hyp=AugmentParams(mosaic=0.0, scale=0.0, translate=0.0), seed=1
    )
    items = [gpu[i] for i in range(4)]
    batcher = GpuBatcher("cpu", counter=gpu.undecodable_samples)
    with caplog.at_level(logging.WARNING, logger="yolov5_smddp.data.gpu_batch"):
        imgs, targets = batcher.assemble(collate_plans(items))[:2]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped:")]
    assert len(lines) == 1 and lines[0].startswith(f"skipped: {bad}: ") and "left grey" in lines[0]
    assert batcher.stats.corrupt == 1 and gpu.undecodable_samples.value == 1
    assert torch.all(imgs[2] == imgs[2, 0, 0, 0]) and 2.0 not in targets[:, 0].tolist()  # grey, no boxes
    assert sorted(set(targets[:, 0].tolist())) == [0.0, 1.0, 3.0]
    assert tree_state(root) == before


def test_recent_partners_and_validation_are_refused_with_a_message(index):
    with pytest.raises(DataError, match="--mosaic-partners random"):
        BytesDataset(index, IMGSZ, augment=True, hyp=None, mosaic_partners="recent")
    with pytest.raises(DataError, match="training batches only"):
        BytesDataset(index, IMGSZ, augment=False, hyp=None)


def test_bench_data_gpu_row_on_the_cpu_device(index):
    from yolov5_smddp.benchmarks.data import gpu_path_rows

    rows = gpu_path_rows(index, IMGSZ, workers=0, batch_size=2, iters=4, device="cpu")
    assert rows["gpu_path_cpu_samples_per_s_0workers"] > 0 and rows["gpu_path_cpu_workers"] == 0
    assert rows["gpu_path_cpu_worker_cpu_ms_per_sample"] > 0
    for stage in ("decode", "mosaic_warp", "hsv_flip"):
        assert rows[f"gpu_path_cpu_{stage}_ms_per_sample"] > 0
    assert rows["gpu_path_cpu_canvas_mib"] == 2 * 3 * (2 * IMGSZ) ** 2 * 4 / 2**20  # two images' float canvas
    assert rows["gpu_path_cpu_staging_mib"] == 0  # pinned staging only with CUDA
    assert 0 < rows["gpu_path_cpu_decoded_mib"] <= 2 * 4 * 3 * 160 * 120 / 2**20  # batch 2: <= 8 decodes
    assert 0 < rows["gpu_path_cpu_peak_batch_jpeg_mib"] < 1 and rows["gpu_path_cpu_fallback_decodes"] == 0


def test_staging_limits_split_the_calls_and_change_no_pixel(odd_index):
    _, gpu = _pair(odd_index, HYPS["affine"], seed=4)
    items = [gpu[i] for i in range(len(gpu))]
    whole = GpuBatcher("cpu").assemble(collate_plans(items))[0]
    small = GpuBatcher("cpu", max_staging_bytes=1)  # every file and every image its own call
    assert torch.equal(small.assemble(collate_plans(items))[0], whole)
    assert small.staging.buffer.numel() == max(
        t.data.nbytes for it in items for t in it[0].first.tiles if t.data is not None
    )
    assert list(gpu_batch._split_by_bytes([1, 2, 3, 4], {1: 5, 2: 5, 3: 11, 4: 1}, 10)) == [[1, 2], [3], [4]]


VARIED = [(333, 250), (400, 300), (700, 525), (250, 333), (160, 120), (90, 200), (1000, 400), (321, 321)]
"""Image sizes that need resizing at 160 px: shrunk 1.5-6x (DCT-reduced at 2x and 4x) and grown."""


@pytest.fixture(scope="module")
def varied_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("varied")
    (root / "images").mkdir()
    (root / "labels").mkdir()
    for k, (w, h) in enumerate(VARIED):
        (root / "images" / f"{k}.jpg").write_bytes(pil_jpeg(photo(w, h, k), quality=90))
        (root / "labels" / f"{k}.txt").write_text("0 0.5 0.5 0.4 0.3\n1 0.3 0.6 0.2 0.2\n")
    return build_label_index([root / "images"], nc=2, root=root, cache_dir=root.parent / "varied-cache")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"hyp": None},
        {"hyp": AugmentParams(mosaic=0.0)},
        {"hyp": AugmentParams(), "rect": True, "batch_size": 4},
    ],
    ids=["mosaic", "letterbox", "rect"],
)
def test_resized_tiles_and_rect_batches(varied_index, kwargs):
    cpu = YoloDataset(
        varied_index, IMGSZ, augment=True, seed=3, color_on_device=True, region_decode=False, **kwargs
    )
    gpu = BytesDataset(varied_index, IMGSZ, augment=True, seed=3, **kwargs)
    for lo in (0, 4):  # rect: two batches of different shapes
        items_c, items_g = [cpu[i] for i in range(lo, lo + 4)], [gpu[i] for i in range(lo, lo + 4)]
        for a, g in zip(items_c, items_g):
            assert np.array_equal(a[1], g[1]) and a[3] == g[3]  # boxes and letterbox shapes exact
        got = GpuBatcher("cpu").assemble(collate_plans(items_g))[0]
        ref = _cpu_batch(items_c)
        assert got.shape == ref.shape
        mean, peak = _stats(got.numpy(), ref.numpy())
        assert mean <= 0.7 and peak <= 40, (mean, peak)  # measured: mean <= 0.52, max <= 28


def test_a_torchvision_without_list_decoding_decodes_file_by_file(index, monkeypatch):
    _, gpu = _pair(index, HYPS["default"])
    items = [gpu[i] for i in range(4)]
    batched = GpuBatcher("cpu").assemble(collate_plans(items))[0]
    monkeypatch.setattr(gpu_batch, "BATCHED_DECODE", False)  # torchvision < 0.19
    one_by_one = GpuBatcher("cpu")
    assert torch.equal(one_by_one.assemble(collate_plans(items))[0], batched)
    assert one_by_one.stats.fallback_decodes == 0 and one_by_one.stats.device_decoded > 0


def test_a_file_gone_since_the_scan_is_handled_in_the_worker_as_the_cpu_path_does(tmp_path, caplog):
    root = tmp_path / "g"
    idx = _four_photos(root, tmp_path / "cache")
    gone = root / "images" / "1.jpg"
    gone.unlink()
    lines = {}
    for name, cls in (("cpu", YoloDataset), ("gpu", BytesDataset)):
        caplog.clear()
        ds = cls(idx, IMGSZ, augment=True, hyp=AugmentParams(mosaic=0.0), seed=1, region_decode=False)
        with caplog.at_level(logging.WARNING, logger="yolov5_smddp.data.dataset"):
            item = ds[1]
        assert item[2] != str(gone) and ds.undecodable_samples.value == 1  # its substitute
        lines[name] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped:")]
    assert (
        lines["gpu"] == lines["cpu"]
        and len(lines["cpu"]) == 1
        and lines["cpu"][0].startswith(f"skipped: {gone}: ")
    )
