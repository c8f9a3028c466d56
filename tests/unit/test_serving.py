"""The model folder that deploys: best.torchscript (+ best.onnx) and code/inference.py, which runs in a
fresh process where yolov5_smddp cannot be imported and answers as `yolov5-smddp predict` does."""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import logging
import os
import struct
import subprocess
import sys
import textwrap
import zlib
from http import HTTPStatus

import cv2
import numpy as np
import pytest
import torch
from detections import assert_same_detections, run_handler, scene_image

from yolov5_smddp.cli import main
from yolov5_smddp.data.letterbox import letterbox
from yolov5_smddp.detection.postprocess import non_max_suppression
from yolov5_smddp.inference import export
from yolov5_smddp.models.weights import save_weights
from yolov5_smddp.models.yolo import build_model
from yolov5_smddp.serving import handler_source, serving_formats, write_model_folder

CONF = 0.1


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """(model dir, best.pt written beside it as training does, the model)."""
    root = tmp_path_factory.mktemp("serving")
    torch.manual_seed(0)
    model = build_model("yolov5n", nc=3)
    with torch.no_grad():  # an objectness prior that lets a random model detect something at CONF
        for conv in model.detect.m:
            conv.bias.view(model.detect.na, -1)[:, 4] += 4.0
    model.names = ["cat", "dog", "bird"]
    model_dir = root / "model"
    weights = save_weights(model_dir / "best.pt", model, meta={}, half=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    written = write_model_folder(model_dir, model, 160, float16_weights=True)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # left untouched
    assert model.training and any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())  # unfused
    assert sorted(written) == sorted(["handler", *serving_formats()])
    return model_dir, weights


def test_model_folder_holds_only_what_serving_needs(folder):
    model_dir, _ = folder
    files = sorted(str(p.relative_to(model_dir)) for p in model_dir.rglob("*") if p.is_file())
    model_file = (
        "best" + export.SUFFIXES[serving_formats()[0]]
    )  # best.pt2 on torch >= 2.10, else .torchscript
    assert files == sorted(["best.onnx", "best.pt", model_file, "code/inference.py"])
    assert (model_dir / "code" / "inference.py").read_text() == handler_source()
    # self-contained: the standard library and what the SageMaker PyTorch inference container has
    tree = ast.parse(handler_source())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {
        "__future__",
        "http",
        "io",
        "json",
        "os",
        "struct",
        "cv2",
        "numpy",
        "torch",
        "torchvision",
    } | {
        "sagemaker_inference"  # optional: the serving container's toolkit, for its 4xx error class
    }
    total = sum((model_dir / f).stat().st_size for f in files)
    assert total < 30 * 2**20, total  # yolov5n: a few MB per file


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scene")
    scene_image(folder / "a.jpg")
    return folder / "a.jpg"


def test_handler_in_a_fresh_process_answers_as_predict(folder, scene, tmp_path):
    model_dir, weights = folder
    out = tmp_path / "predict"
    argv = ["predict", "--weights", str(weights), "--source", str(scene), "--out", str(out)]
    assert main([*argv, "--imgsz", "160", "--conf", str(CONF)]) == 0
    want = json.loads((out / "a.json").read_text())
    got = run_handler(model_dir, scene, "image/jpeg", YOLOV5_CONF=str(CONF))
    assert set(got) == {"width", "height", "detections"}
    assert len(want["detections"]) > 3
    assert_same_detections(got, want)
    # the same image as a .npy RGB array and as a PNG gives the same answer
    rgb = cv2.cvtColor(cv2.imread(str(scene)), cv2.COLOR_BGR2RGB)
    np.save(tmp_path / "a.npy", rgb)
    assert_same_detections(
        run_handler(model_dir, tmp_path / "a.npy", "application/x-npy", YOLOV5_CONF=str(CONF)), want
    )
    cv2.imwrite(str(tmp_path / "a.png"), cv2.imread(str(scene)))
    assert_same_detections(
        run_handler(model_dir, tmp_path / "a.png", "image/png", YOLOV5_CONF=str(CONF)), want
    )
    # the default threshold (0.25) as predict's default
    fewer = run_handler(model_dir, scene, "image/jpeg")
    assert all(d["score"] > 0.25 for d in fewer["detections"])
    assert len(fewer["detections"]) == sum(d["score"] > 0.25 for d in want["detections"])


def _handler_module(folder):
    spec = importlib.util.spec_from_file_location("inference_under_test", folder[0] / "code" / "inference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_request_gets_the_same_bits(folder, scene, monkeypatch):
    """TorchScript's profiling executor would run the first call as exported and later ones through a graph
    it optimized (torch 2.6 on the CPU: 3e-8 apart, enough to flip a near-tie of this random model): the
    handler runs every request unoptimized, so the same image gets the same answer every time."""
    handler = _handler_module(folder)
    model = handler.model_fn(str(folder[0]))
    torch.manual_seed(0)
    x = torch.rand(1, 3, *model["imgsz"])
    x = x.half() if model["half"] else x
    with torch.inference_mode():
        raw = [handler.forward(model, x) for _ in range(4)]
    assert raw[0].shape[-1] == 5 + 3
    assert all(torch.equal(raw[0], r) for r in raw[1:]), [(raw[0] - r).abs().max().item() for r in raw[1:]]
    rgb = cv2.cvtColor(cv2.imread(str(scene)), cv2.COLOR_BGR2RGB)
    monkeypatch.setenv("YOLOV5_CONF", str(CONF))
    served = [handler.predict_fn(rgb, model) for _ in range(3)]
    assert len(served[0]["detections"]) > 3
    assert served[1] == served[0] and served[2] == served[0]


def test_handler_rejects_what_it_cannot_read(folder, monkeypatch):
    handler = _handler_module(folder)
    with pytest.raises(ValueError, match="unsupported content type 'text/csv'") as refused:
        handler.input_fn(b"1,2", "text/csv")
    assert refused.value.status_code == 415
    with pytest.raises(
        ValueError, match=r"\(10 bytes, starting b'not a jp'\) is not a JPEG, PNG, BMP, WebP or TIFF"
    ) as refused:
        handler.input_fn(b"not a jpeg", "image/jpeg")
    assert refused.value.status_code == 400
    ok, jpeg = cv2.imencode(".jpg", np.zeros((16, 16, 3), np.uint8))
    with pytest.raises(ValueError, match="not a readable JPEG image: OpenCV cannot decode it"):
        handler.input_fn(jpeg.tobytes()[:200], "image/jpeg")  # a frame header, then nothing to decode
    buffer = io.BytesIO()
    np.save(buffer, np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match=r"expected a uint8 \[H, W, 3\] RGB array, got float32 \[4, 4\]"):
        handler.input_fn(buffer.getvalue(), "application/x-npy")
    with pytest.raises(ValueError, match="unsupported accept type 'text/html'") as refused:
        handler.output_fn({"width": 1, "height": 1, "detections": []}, "text/html")
    assert refused.value.status_code == 406
    assert json.loads(handler.output_fn({"width": 1, "height": 2, "detections": []}, "application/json")) == {
        "width": 1,
        "height": 2,
        "detections": [],
    }
    monkeypatch.setenv("YOLOV5_CONF", "2")
    with pytest.raises(ValueError, match="YOLOV5_CONF 2.0"):
        handler.thresholds()
    monkeypatch.setenv("YOLOV5_CONF", "0.5")
    monkeypatch.setenv("YOLOV5_IOU", "0.6")
    monkeypatch.setenv("YOLOV5_MAX_DET", "7")
    assert handler.thresholds() == (0.5, 0.6, 7)


def test_handler_letterbox_and_nms_are_predicts(folder):
    """The handler's own copies of letterbox and NMS give exactly what the package's functions give."""
    handler = _handler_module(folder)
    image = np.random.default_rng(0).integers(0, 255, (75, 203, 3), dtype=np.uint8)
    for shape in ((160, 160), (96, 224), (320, 128)):
        got, want = handler.letterbox(image, shape), letterbox(image, shape, auto=False)
        assert np.array_equal(got[0], want[0]) and got[1:] == want[1:]
    pred = torch.rand(1, 500, 8, generator=torch.Generator().manual_seed(1))
    pred[..., :2] *= 160
    pred[..., 2:4] *= 40
    for conf, iou, max_det in ((0.25, 0.45, 300), (0.1, 0.3, 5)):
        (want,) = non_max_suppression(pred, conf, iou, max_det=max_det)
        assert torch.equal(handler.nms(pred[0], conf, iou, max_det), want)


def test_a_failing_onnx_export_leaves_a_folder_that_deploys(tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("exporter bug")

    monkeypatch.setattr(export, "_onnx", broken)
    with caplog.at_level(logging.WARNING):
        written = write_model_folder(tmp_path, build_model("yolov5n", nc=2), 64)
    model_format = serving_formats()[0]  # pt2 on torch >= 2.10, else torchscript
    assert sorted(written) == ["handler", model_format]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "best" + export.SUFFIXES[model_format],
        "code/inference.py",
    ]
    assert "best.onnx not written (RuntimeError: exporter bug)" in caplog.text


def test_after_a_sigterm_exports_are_written_only_while_the_window_allows(tmp_path, caplog):
    """The handler always; each export (cheapest first) only with EXPORT_MARGIN_S left before SIGKILL,
    the skipped ones named in one line."""
    from yolov5_smddp.serving import EXPORT_MARGIN_S

    model = build_model("yolov5n", nc=2)
    clock = iter([EXPORT_MARGIN_S + 1, EXPORT_MARGIN_S - 1])  # seconds left, asked before each export
    with caplog.at_level(logging.WARNING):
        written = write_model_folder(tmp_path / "a", model, 64, time_left=lambda: next(clock))
    model_format = serving_formats()[0]  # pt2 on torch >= 2.10, else torchscript
    assert sorted(written) == ["handler", model_format]
    assert sorted(str(p.relative_to(tmp_path / "a")) for p in (tmp_path / "a").rglob("*") if p.is_file()) == [
        "best" + export.SUFFIXES[model_format],
        "code/inference.py",
    ]
    assert "model folder: best.onnx skipped: 29 s left before SIGKILL" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        written = write_model_folder(tmp_path / "b", model, 64, time_left=lambda: 3.0)
    assert sorted(written) == ["handler"]
    assert f"model folder: best{export.SUFFIXES[model_format]}, best.onnx skipped: 3 s left" in caplog.text
    written = write_model_folder(tmp_path / "c", model, 64, time_left=lambda: None)  # no SIGTERM
    assert sorted(written) == sorted(["handler", "onnx", model_format])


# --- limits: decompression bombs are refused before anything is decoded --------------------------------------

BOMB_SIDE = (
    20000  # 400,000,000 pixels: over the default limit 2^27, under OpenCV's own 2^30 (it would decode)
)
BOMB_REFUSED = "claims 20000x20000 px (400,000,000 pixels), over the limit of 134,217,728; not decoded"


def png_bomb(width: int, height: int) -> bytes:
    """A valid 8-bit RGB PNG of black pixels, built without holding its pixels: zlib compresses one row and
    ends it with a full flush (byte-aligned, no references back), so that segment repeated once per row is
    a valid deflate stream of every row; the final block and the Adler-32 of all rows close it."""
    row = bytes(1 + 3 * width)  # filter type 0, then black pixels
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    segment = deflate.compress(row) + deflate.flush(zlib.Z_FULL_FLUSH)
    final_block = deflate.flush()
    adler = 1
    for _ in range(height):
        adler = zlib.adler32(row, adler)
    idat = b"\x78\xda" + segment * height + final_block + struct.pack(">I", adler)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8 bits, RGB, deflate, no interlace
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def jpeg_bomb(width: int, height: int) -> bytes:
    """OpenCV's JPEG of a 16 x 16 grey square with the frame header (SOF0) rewritten to claim width x
    height: a scan of a few hundred bytes that libjpeg decodes into a full-size image (the missing data
    becomes grey, with a warning)."""
    ok, encoded = cv2.imencode(".jpg", np.full((16, 16, 3), 128, np.uint8))
    body = bytearray(encoded.tobytes())
    sof = body.index(b"\xff\xc0")
    struct.pack_into(">HH", body, sof + 5, height, width)
    return bytes(body)


def npy_bomb(width: int, height: int) -> bytes:
    """numpy's own .npy header for a uint8 [height, width, 3] array, followed by 16 bytes only."""
    stream = io.BytesIO()
    header = {"descr": "|u1", "fortran_order": False, "shape": (height, width, 3)}
    np.lib.format.write_array_header_1_0(stream, header)
    return stream.getvalue() + bytes(16)


def _encoded(ext: str, image: np.ndarray, *params: int) -> bytes:
    ok, encoded = cv2.imencode(ext, image, list(params))
    assert ok, ext
    return encoded.tobytes()


def _tiff_with_sides(body: bytes, width: int, height: int) -> bytes:
    """`body` (OpenCV's TIFF) with its first directory's ImageWidth / ImageLength rewritten."""
    body = bytearray(body)
    endian = "<" if body[:2] == b"II" else ">"
    (directory,) = struct.unpack_from(endian + "I", body, 4)
    (count,) = struct.unpack_from(endian + "H", body, directory)
    for entry in range(directory + 2, directory + 2 + 12 * count, 12):
        tag, kind = struct.unpack_from(endian + "HH", body, entry)
        if tag in (256, 257):
            struct.pack_into(endian + "HHI", body, entry, tag, 4, 1)  # a LONG now, whatever it was
            struct.pack_into(endian + "I", body, entry + 8, width if tag == 256 else height)
    return bytes(body)


def test_bomb_makers_make_files_that_decoders_accept():
    """The bombs, at a harmless size, decode to the size they claim (at 20000 px they would too: that is
    what the refusal saves)."""
    small = cv2.imdecode(np.frombuffer(png_bomb(300, 200), np.uint8), cv2.IMREAD_COLOR)
    assert small.shape == (200, 300, 3) and not small.any()
    assert len(png_bomb(BOMB_SIDE, BOMB_SIDE)) < 2 * 2**20  # a 1.2 GB image in under 2 MB
    grey = cv2.imdecode(np.frombuffer(jpeg_bomb(640, 480), np.uint8), cv2.IMREAD_COLOR)
    assert grey.shape == (480, 640, 3)
    stream = io.BytesIO(npy_bomb(BOMB_SIDE, BOMB_SIDE))
    assert np.lib.format.read_magic(stream) == (1, 0)
    shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
    assert shape == (BOMB_SIDE, BOMB_SIDE, 3) and dtype == np.uint8


def test_header_sizes_are_what_opencv_decodes(folder):
    """image_size reads (w, h) from each format's header exactly as OpenCV then decodes it."""
    handler = _handler_module(folder)
    rng = np.random.default_rng(3)
    image = rng.integers(0, 255, (75, 203, 3), dtype=np.uint8)
    with_alpha = np.dstack([image, np.full((75, 203), 200, np.uint8)])
    cases = {
        ("JPEG", "baseline"): _encoded(".jpg", image),
        ("JPEG", "progressive"): _encoded(".jpg", image, cv2.IMWRITE_JPEG_PROGRESSIVE, 1),
        ("PNG", ""): _encoded(".png", image),
        ("BMP", ""): _encoded(".bmp", image),
        ("WebP", "VP8 "): _encoded(".webp", image, cv2.IMWRITE_WEBP_QUALITY, 80),
        ("WebP", "VP8L"): _encoded(".webp", image, cv2.IMWRITE_WEBP_QUALITY, 101),
        ("WebP", "VP8X"): _encoded(".webp", with_alpha, cv2.IMWRITE_WEBP_QUALITY, 80),
        ("TIFF", ""): _encoded(".tiff", image),
    }
    for (kind, variant), body in cases.items():
        if kind == "WebP":
            assert body[12:16] == variant.encode(), (variant, body[12:16])
        decoded = cv2.imdecode(np.frombuffer(body, np.uint8), cv2.IMREAD_COLOR)
        assert handler.image_size(body) == (kind, decoded.shape[1], decoded.shape[0]) == (kind, 203, 75)
        assert np.array_equal(handler.input_fn(body, "image/png"), cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB))


def test_bombs_of_every_format_are_refused_with_the_limit_and_its_variable(folder):
    handler = _handler_module(folder)
    image = np.full((32, 48, 3), 90, np.uint8)
    vp8l = bytearray(_encoded(".webp", image, cv2.IMWRITE_WEBP_QUALITY, 101))
    struct.pack_into(
        "<I", vp8l, 21, (16383 << 14) | 16383 | (struct.unpack_from("<I", vp8l, 21)[0] & ~(2**28 - 1))
    )
    bmp = bytearray(_encoded(".bmp", image))
    struct.pack_into("<ii", bmp, 18, BOMB_SIDE, -BOMB_SIDE)  # top-down rows: a negative height
    bombs = {
        "PNG": (png_bomb(BOMB_SIDE, BOMB_SIDE), "image/png", BOMB_REFUSED),
        "JPEG": (jpeg_bomb(BOMB_SIDE, BOMB_SIDE), "image/jpeg", BOMB_REFUSED),
        "BMP": (bytes(bmp), "image/bmp", BOMB_REFUSED),
        "WebP": (bytes(vp8l), "image/webp", "claims 16384x16384 px (268,435,456 pixels), over the limit"),
        "TIFF": (
            _tiff_with_sides(_encoded(".tiff", image), BOMB_SIDE, BOMB_SIDE),
            "image/tiff",
            BOMB_REFUSED,
        ),
    }
    for kind, (body, content_type, reason) in bombs.items():
        with pytest.raises(handler.RequestRefused) as refused:
            handler.input_fn(body, content_type)
        assert refused.value.status_code == 413, kind
        message = str(refused.value)
        assert message.startswith(f"{kind} image: its header {reason}"), message
        assert "environment variable YOLOV5_MAX_IMAGE_PIXELS raises it" in message and "\n" not in message
    with pytest.raises(handler.RequestRefused) as refused:
        handler.input_fn(npy_bomb(BOMB_SIDE, BOMB_SIDE), "application/x-npy")
    assert refused.value.status_code == 413
    assert str(refused.value).startswith(f"application/x-npy: its header {BOMB_REFUSED}")
    # an .npy whose data does not match its header, and one that is no .npy at all: 400
    with pytest.raises(
        handler.RequestRefused, match=r"declares \[4, 5, 3\] \(60 bytes of pixels\) but 16 bytes"
    ):
        handler.input_fn(npy_bomb(5, 4), "application/x-npy")
    with pytest.raises(handler.RequestRefused, match="request body is not an .npy array") as refused:
        handler.input_fn(b"\x89PNG....", "application/x-npy")
    assert refused.value.status_code == 400


def test_limits_come_from_the_environment(folder, scene, monkeypatch):
    handler = _handler_module(folder)
    assert handler.limits() == (2**27, 3 * 2**27 + 2**20)  # training's default; an .npy at it fits
    body = scene.read_bytes()  # 260 x 180 = 46,800 pixels
    monkeypatch.setenv("YOLOV5_MAX_IMAGE_PIXELS", "46799")
    assert handler.limits() == (46799, 3 * 46799 + 2**20)  # the byte limit follows the pixel limit
    with pytest.raises(
        handler.RequestRefused, match=r"claims 260x180 px \(46,800 pixels\), over the limit of 46,799"
    ):
        handler.input_fn(body, "image/jpeg")
    monkeypatch.setenv("YOLOV5_MAX_IMAGE_PIXELS", "46800")
    assert handler.input_fn(body, "image/jpeg").shape == (180, 260, 3)
    monkeypatch.setenv("YOLOV5_MAX_REQUEST_BYTES", str(len(body) - 1))
    with pytest.raises(handler.RequestRefused) as refused:
        handler.input_fn(body, "image/jpeg")
    assert refused.value.status_code == 413
    assert str(refused.value) == (
        f"request body of {len(body):,} bytes is over the limit of {len(body) - 1:,} bytes (the endpoint's "
        "environment variable YOLOV5_MAX_REQUEST_BYTES raises it)"
    )
    monkeypatch.setenv("YOLOV5_MAX_REQUEST_BYTES", str(len(body)))
    assert handler.input_fn(body, "image/jpeg").shape == (180, 260, 3)
    for name, value in (("YOLOV5_MAX_IMAGE_PIXELS", "0"), ("YOLOV5_MAX_REQUEST_BYTES", "1e6")):
        monkeypatch.delenv("YOLOV5_MAX_IMAGE_PIXELS", raising=False)
        monkeypatch.delenv("YOLOV5_MAX_REQUEST_BYTES", raising=False)
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=f"{name}='{value}' must be a whole number >= 1") as bad:
            handler.limits()
        assert not isinstance(bad.value, handler.RequestRefused)  # the endpoint's configuration: a 500


# Serves a normal image, a bomb, then the normal image again, in a fresh process as the endpoint would; the
# rise of the process's peak memory (ru_maxrss, KiB on Linux) is measured around the bomb. One process per
# bomb: the peak is a high-water mark, which one bomb served would hide another's cost under.
MEMORY_RUN = textwrap.dedent(
    """
    import json, resource, sys
    sys.modules["yolov5_smddp"] = None
    model_dir, normal, bomb, content_type = sys.argv[1:]
    sys.path.insert(0, model_dir + "/code")
    import inference

    def peak_bytes():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def serve(path, content_type):
        with open(path, "rb") as handle:
            body = handle.read()
        before = peak_bytes()
        try:
            data = inference.input_fn(body, content_type)
            answer = {"served": json.loads(inference.output_fn(inference.predict_fn(data, model), "*/*"))}
        except inference.RequestRefused as refused:
            answer = {"status": refused.status_code, "reason": refused.message}
        return {**answer, "rise": peak_bytes() - before}

    model = inference.model_fn(model_dir)
    first = serve(normal, "image/jpeg")
    print(json.dumps({"first": first, "bomb": serve(bomb, content_type), "again": serve(normal, "image/jpeg")}))
    """
)

MEMORY_BOUND = 64 * 2**20  # a refusal allocates next to nothing; serving a 20000 px bomb costs > 1 GB


@pytest.mark.parametrize("content_type", ["image/png", "image/jpeg", "application/x-npy"])
def test_a_bomb_in_a_fresh_process_is_refused_at_no_memory_cost(folder, scene, tmp_path, content_type):
    model_dir, _ = folder
    make = {"image/png": png_bomb, "image/jpeg": jpeg_bomb, "application/x-npy": npy_bomb}[content_type]
    (tmp_path / "bomb").write_bytes(make(BOMB_SIDE, BOMB_SIDE))
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    proc = subprocess.run(
        [sys.executable, "-c", MEMORY_RUN, str(model_dir), str(scene), str(tmp_path / "bomb"), content_type],
        env={**clean, "OMP_NUM_THREADS": "1", "YOLOV5_CONF": str(CONF)},
        cwd=model_dir,
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard only
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    bomb = report["bomb"]
    print(content_type, "peak-memory rise", bomb["rise"], bomb.get("status"))
    assert bomb.get("status") == 413, bomb.get("reason", "served")
    assert BOMB_REFUSED in bomb["reason"], bomb
    assert bomb["rise"] < MEMORY_BOUND, bomb["rise"]
    # the endpoint still serves, and the same detections, after the bomb
    assert len(report["first"]["served"]["detections"]) > 3
    assert report["again"]["served"] == report["first"]["served"]


# The SageMaker PyTorch serving stack, as its TorchServe worker runs it: TorchServe's model loader builds the
# Service around sagemaker_pytorch_serving_container's HandlerService (which imports code/inference.py through
# the sagemaker_inference Transformer), and Service.predict returns the binary answer the worker sends to
# TorchServe's frontend, one HTTP status per request. Only the Java frontend, which copies that status onto
# the HTTP response, is not run.
TOOLKIT_RUN = textwrap.dedent(
    """
    import json, os, struct, sys
    import ts
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
    from ts.model_loader import TsModelLoader

    model_dir, *requests = sys.argv[1:]
    metrics = MetricsCacheYamlImpl(os.path.join(os.path.dirname(ts.__file__), "configs", "metrics.yaml"))
    service = TsModelLoader().load(
        "model", model_dir, "sagemaker_pytorch_serving_container.handler_service", None, 1, None, True, metrics
    )
    service.set_cl_socket(None)

    def parse(message):
        pos = 0
        def take(fmt):
            nonlocal pos
            (value,) = struct.unpack_from(fmt, message, pos)
            pos += struct.calcsize(fmt)
            return value
        def text():
            nonlocal pos
            n = take("!i")
            pos += n
            return bytes(message[pos - n : pos]).decode()
        answer = {"code": take("!i"), "message": text()}
        answer["request_id"], answer["content_type"] = text(), text()
        answer["status"], answer["phrase"] = take("!i"), text()
        answer["headers"] = {text(): text() for _ in range(take("!i"))}
        answer["body"] = text()
        return answer

    answers = []
    for i, (path, content_type, conf) in enumerate(zip(requests[::3], requests[1::3], requests[2::3])):
        os.environ["YOLOV5_CONF"] = conf
        with open(path, "rb") as handle:
            body = bytearray(handle.read())  # what TorchServe's worker reads off its socket
        headers = [{"name": b"Content-Type", "value": content_type.encode()}, {"name": b"Accept", "value": b"*/*"}]
        parameters = [{"name": "body", "contentType": content_type, "value": body}]
        batch = [{"requestId": str(i).encode(), "headers": headers, "parameters": parameters}]
        answers.append(parse(service.predict(batch)))
    print(json.dumps(answers))
    """
)


def test_sagemaker_serving_toolkit_answers_refusals_with_their_4xx_status(folder, scene, tmp_path):
    missing = [
        name
        for name in ("ts", "sagemaker_inference", "sagemaker_pytorch_serving_container")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        pytest.skip(
            f"the SageMaker PyTorch serving stack is not installed ({', '.join(missing)}; docker/test.Dockerfile installs it)"
        )
    model_dir, _ = folder
    (tmp_path / "bomb.png").write_bytes(png_bomb(BOMB_SIDE, BOMB_SIDE))
    (tmp_path / "notes.txt").write_bytes(b"not an image")
    requests = [
        (scene, "image/jpeg", str(CONF)),
        (tmp_path / "bomb.png", "image/png", str(CONF)),
        (tmp_path / "notes.txt", "image/jpeg", str(CONF)),
        (tmp_path / "notes.txt", "text/plain", str(CONF)),
        (scene, "image/jpeg", "2"),  # a broken endpoint setting: the server's fault, 500
    ]
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    # the toolkit's torchserve.py puts the model's code/ folder on the worker's PYTHONPATH
    pythonpath = os.pathsep.join([str(model_dir / "code"), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-c", TOOLKIT_RUN, str(model_dir), *(str(a) for r in requests for a in r)],
        # SAGEMAKER_PROGRAM as the SDK's PyTorchModel(entry_point="inference.py") sets it (the training
        # image's own value, entrypoint.py, would make the toolkit fall back to its default handler)
        env={**clean, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath, "SAGEMAKER_PROGRAM": "inference.py"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard only
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    served, bomb, garbage, text, misconfigured = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (served["code"], served["status"]) == (200, 200)
    assert len(json.loads(served["body"])["detections"]) > 3
    assert (bomb["status"], bomb["phrase"]) == (413, HTTPStatus(413).phrase)  # "Content Too Large" in 3.13
    assert (
        bomb["body"].splitlines()[0]
        == f"PNG image: its header {BOMB_REFUSED} (the endpoint's environment variable YOLOV5_MAX_IMAGE_PIXELS raises it)"
    )
    assert (garbage["status"], garbage["phrase"]) == (400, "Bad Request")
    assert garbage["body"].startswith("request body (12 bytes, starting b'not an i') is not a JPEG")
    assert (text["status"], text["phrase"]) == (415, "Unsupported Media Type")
    assert misconfigured["status"] == 500
    assert misconfigured["body"].startswith("YOLOV5_CONF 2.0 / YOLOV5_IOU 0.45 must lie in [0, 1]")
