"""Export a trained detector to TorchScript, ONNX and OpenVINO IR (files that serving stacks load without
this package), and to a TensorRT engine where TensorRT and a GPU are present.

All of them compute the eval-mode output of the model (`DetectionModel` with BatchNorm folded):
input `images` float [B, 3, H, W], RGB in [0, 1], letterboxed; output `output0` [B, N, 5 + nc] with
(xc, yc, w, h) in input pixels, objectness and class probabilities; NMS is left to the caller, as ONNX
users of YOLOv5 expect. Metadata: ONNX `metadata_props` "stride" ("32") and "names" (a Python dict literal,
"{0: 'person', ...}", as the release writes it); TorchScript an extra file `config.txt` holding JSON
{"shape", "stride", "names", "imgsz"}; OpenVINO a folder `<stem>_openvino_model/` holding `<stem>.xml`,
`<stem>.bin` (float32 weights) and `metadata.yaml` {"stride", "names"}, as the
release lays it out.
"""

from __future__ import annotations

import importlib
import inspect
import io
import json
import logging
import os
import secrets
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import nn

from yolov5_smddp.errors import ConfigError, output_error
from yolov5_smddp.files import claimed_dir
from yolov5_smddp.files.atomic import atomic_write, make_folder
from yolov5_smddp.models.yolo import DetectionModel

log = logging.getLogger(__name__)

FORMATS = ("torchscript", "pt2", "onnx", "openvino", "engine")
SUFFIXES = {
    "torchscript": ".torchscript",
    "pt2": ".pt2",  # a torch.export ExportedProgram (torch.export.save), the successor of TorchScript
    "onnx": ".onnx",
    "openvino": "_openvino_model",
    "engine": ".engine",
}
INPUT_NAME, OUTPUT_NAME = "images", "output0"
TORCHSCRIPT_CONFIG = "config.txt"
OPENVINO_METADATA = "metadata.yaml"
SIMPLIFIERS = ("onnxslim", "onnxsim")  # tried in this order for --simplify
DEFAULT_OPSET = 17


@dataclass(frozen=True)
class ExportOptions:
    """What to write: `include` ⊆ FORMATS; `imgsz` (h, w) multiples of the model's largest stride."""

    include: tuple[str, ...] = ("torchscript",)
    imgsz: tuple[int, int] = (640, 640)
    batch_size: int = 1
    dynamic: bool = False
    half: bool = False
    opset: int = DEFAULT_OPSET
    simplify: bool = False


class ExportModule(nn.Module):
    """The model's eval forward with only the decoded predictions as output (no raw per-level list)."""

    def __init__(self, model: DetectionModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images)[0]


def image_size(values: Sequence[int]) -> tuple[int, int]:
    """--imgsz as given (one value: square; two: height width) → (h, w)."""
    if len(values) not in (1, 2):
        raise ConfigError(f"--imgsz {' '.join(map(str, values))}: give one size or height and width")
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def check_options(options: ExportOptions, stride: int, device: torch.device) -> None:
    """ConfigError naming the option when it cannot be exported."""
    unknown = [f for f in options.include if f not in FORMATS]
    if unknown or not options.include:
        raise ConfigError(f"--include {' '.join(options.include)}: choose from {', '.join(FORMATS)}")
    if any(s <= 0 or s % stride for s in options.imgsz):
        raise ConfigError(
            f"--imgsz {options.imgsz[0]} {options.imgsz[1]}: must be positive multiples of {stride}"
        )
    if options.batch_size < 1:
        raise ConfigError(f"--batch-size {options.batch_size}: must be at least 1")
    if options.half and device.type != "cuda":
        raise ConfigError("--half: float16 export needs a GPU (--device cuda); CPUs export float32")
    if options.half and options.dynamic:
        raise ConfigError("--half and --dynamic together are not supported; choose one")
    if options.half and "openvino" in options.include:
        raise ConfigError("--half with --include openvino: OpenVINO IR is written float32; drop --half")
    if "engine" in options.include:
        check_tensorrt(device, importlib.util.find_spec("tensorrt") is not None)


def check_tensorrt(device: torch.device, importable: bool) -> None:
    """ConfigError unless a TensorRT engine can be built here: the tensorrt package and a CUDA device."""
    if not importable:
        raise ConfigError(
            "--include engine: TensorRT is not installed here (pip install tensorrt on a machine with an "
            "NVIDIA GPU); export onnx or openvino instead, or build the engine from the .onnx with trtexec"
        )
    if device.type != "cuda":
        raise ConfigError(
            "--include engine: a TensorRT engine is built on the GPU it runs on; give --device cuda"
        )
    raise ConfigError(
        "--include engine: building TensorRT engines is not supported by this version; export onnx and "
        "build the engine with trtexec --onnx=<file>.onnx --saveEngine=<file>.engine"
    )


def names_literal(names: Sequence[str]) -> str:
    """The `names` metadata as the release writes it: a Python dict literal {index: name}."""
    return repr(dict(enumerate(str(n) for n in names)))


def export_model(
    model: DetectionModel, stem: Path, options: ExportOptions, device: torch.device | str = "cpu"
) -> dict[str, Path]:
    """Write `<stem>.torchscript` and/or `<stem>.onnx` for `model` (fused in place, eval mode);
    returns {format: path}. Each file is written atomically."""
    device = torch.device(device)
    stride = int(max(model.stride.tolist()))
    check_options(options, stride, device)
    if "onnx" in options.include:
        require_onnx()
    if "openvino" in options.include:
        require_openvino()
    model = model.to(device).fuse().eval()
    for p in model.parameters():
        p.requires_grad_(False)
    module = ExportModule(model).eval()  # eval: the ONNX exporter restores the mode it found
    dtype = torch.float16 if options.half else torch.float32
    module = module.to(dtype)
    example = torch.zeros(options.batch_size, 3, *options.imgsz, device=device, dtype=dtype)
    with torch.inference_mode():
        output = module(example)  # a dry run: shapes for the log, and lazy initialisation done
    written = {}
    for fmt in options.include:
        path = stem.with_name(stem.name + SUFFIXES[fmt])  # not with_suffix: a stem may hold dots (v3.0-x)
        if fmt == "torchscript":
            _torchscript(module, example, path, _config(model, example, options))
        elif fmt == "pt2":
            _pt2(module, example, path, _config(model, example, options))
        elif fmt == "onnx":
            _onnx(module, example, path, options, _metadata(model), output.shape[2])
        else:
            _openvino(module, example, path, options, model)
        written[fmt] = path
        files = sorted(path.iterdir()) if path.is_dir() else [path]
        size_mb = sum(f.stat().st_size for f in files) / 2**20
        log.info(
            "%s: %s (%.1f MB), input %s %s, output %s %s",
            fmt,
            path,
            size_mb,
            INPUT_NAME,
            list(example.shape),
            OUTPUT_NAME,
            list(output.shape),
        )
    return written


def _config(model: DetectionModel, example: torch.Tensor, options: ExportOptions) -> dict:
    return {
        "shape": list(example.shape),
        "stride": int(max(model.stride.tolist())),
        "names": dict(enumerate(model.names)),
        "imgsz": list(options.imgsz),
        "dynamic": options.dynamic,
        "half": options.half,
    }


def _metadata(model: DetectionModel) -> dict[str, str]:
    return {"stride": str(int(max(model.stride.tolist()))), "names": names_literal(model.names)}


def _torchscript(module: nn.Module, example: torch.Tensor, path: Path, config: dict) -> None:
    with torch.inference_mode(False), torch.no_grad():
        traced = torch.jit.trace(module, example, strict=False, check_trace=False)
    extra = {TORCHSCRIPT_CONFIG: json.dumps(config)}
    with atomic_write(path) as handle:
        torch.jit.save(traced, handle, _extra_files=extra)


def _pt2(module: nn.Module, example: torch.Tensor, path: Path, config: dict) -> None:
    """The module as a torch.export ExportedProgram (no TorchScript: torch deprecates torch.jit from 2.10
    on), its config as the archive's extra file config.txt, as best.torchscript carries it."""
    with torch.inference_mode(False), torch.no_grad():
        program = torch.export.export(module, (example,), strict=False)
    # serialised in memory first: torch's zip writer aborts the process (a C++ exception while it is
    # collected) when the file under it fails to write, e.g. a full model folder; the bytes then go through
    # atomic_write, whose failure is a plain OutputError (exit 2)
    buffer = io.BytesIO()
    torch.export.save(program, buffer, extra_files={TORCHSCRIPT_CONFIG: json.dumps(config)})
    with atomic_write(path) as handle:
        handle.write(buffer.getbuffer())


@contextmanager
def _written_as(path: Path) -> Iterator[None]:
    """A write failure inside the block (torch.onnx.export's own file: a full disk) → OutputError for
    `path`, the file the user asked for; anything else propagates unchanged."""
    try:
        yield
    except Exception as exc:
        failed_write = output_error(exc, path)
        if failed_write is None:
            raise
        raise failed_write from exc


def require_onnx():
    """The `onnx` package, or ConfigError saying how to get it."""
    try:
        import onnx
    except ImportError:
        raise ConfigError(
            "ONNX export needs the onnx package, which is not installed (pip install onnx)"
        ) from None
    return onnx


NEW_ONNX_EXPORTER_FROM = (2, 10)
NEW_EXPORTER_MIN_OPSET = 18


def new_onnx_exporter(torch_version: str | None = None) -> bool:
    """Whether ONNX export uses torch's torch.export-based exporter (torch >= 2.10) rather than the
    deprecated TorchScript-based one."""
    release = tuple(int(p) for p in (torch_version or torch.__version__).split("+")[0].split(".")[:2])
    return release >= NEW_ONNX_EXPORTER_FROM


def require_onnxscript():
    """The `onnxscript` package (torch's new ONNX exporter needs it), or ConfigError saying how to get it."""
    try:
        import onnxscript
    except ImportError:
        raise ConfigError(
            f"ONNX export on torch {torch.__version__} needs the onnxscript package, which is not installed "
            "(pip install onnxscript)"
        ) from None
    return onnxscript


def _onnx(
    module: nn.Module,
    example: torch.Tensor,
    path: Path,
    options: ExportOptions,
    meta: dict,
    channels_out: int,
) -> None:
    onnx = require_onnx()
    kwargs = {}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        # torch >= 2.10: the torch.export-based exporter (needs onnxscript; the TorchScript-based one is
        # deprecated there); older torch: the TorchScript-based one (named dynamic axes, any torch >= 2.1)
        kwargs["dynamo"] = new_onnx_exporter()
        if kwargs["dynamo"]:
            require_onnxscript()
            kwargs["optimize"] = True
            if "external_data" in inspect.signature(torch.onnx.export).parameters:
                kwargs["external_data"] = False  # one file (else the weights land in <tmp>.data beside it)
    dynamic_axes = None
    if options.dynamic:
        dynamic_axes = {
            INPUT_NAME: {0: "batch", 2: "height", 3: "width"},
            OUTPUT_NAME: {0: "batch", 1: "anchors"},
        }
    make_folder(path.parent)
    # the exporter's own file: in the claimed folder's staging folder (a model folder during training), named
    # as atomic_write names its temporaries, so a sweep after a kill removes it (claimed_dir.py)
    tmp = (claimed_dir.staging_for(path.parent) or path.parent) / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        with torch.no_grad(), _written_as(path):
            torch.onnx.export(
                module,
                (example,),
                str(tmp),
                # torch's new exporter builds opset 18 (its version converter has no Resize adapter down to 17)
                opset_version=max(options.opset, NEW_EXPORTER_MIN_OPSET)
                if kwargs.get("dynamo")
                else options.opset,
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_axes=dynamic_axes,
                do_constant_folding=True,
                **kwargs,
            )
        graph = onnx.load(str(tmp))
        # the channel count is fixed even in a dynamic graph, where the exporter names it symbolically
        channels = graph.graph.output[0].type.tensor_type.shape.dim[2]
        channels.Clear()
        channels.dim_value = channels_out
        if (
            options.dynamic
        ):  # the names the TorchScript-based exporter gave (the new one names them s0, s1, ...)
            for value, names in (
                (graph.graph.input[0], ("batch", None, "height", "width")),
                (graph.graph.output[0], ("batch", "anchors", None)),
            ):
                for dim, name in zip(value.type.tensor_type.shape.dim, names, strict=True):
                    if name is not None and not dim.HasField("dim_value"):
                        dim.dim_param = name
        if options.simplify:
            graph = simplified(graph)
        onnx.checker.check_model(graph)
        for key, value in meta.items():
            entry = graph.metadata_props.add()
            entry.key, entry.value = key, value
        with atomic_write(path) as handle:
            handle.write(graph.SerializeToString())
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_name(tmp.name + ".data").unlink(missing_ok=True)  # the new exporter's external data, if any


def simplified(graph):
    """`graph` (an onnx ModelProto) simplified by onnxslim or onnxsim, whichever is importable first;
    unchanged, with one log line, when neither is (or when the simplifier fails on it)."""
    for name in SIMPLIFIERS:
        try:
            simplifier = importlib.import_module(name)
        except ImportError:
            continue
        try:
            if name == "onnxslim":
                result, ok = simplifier.slim(graph), True
            else:
                result, ok = simplifier.simplify(graph)
            if ok:
                log.info("--simplify: %s %s", name, getattr(simplifier, "__version__", ""))
                return result
            log.warning("--simplify: onnxsim could not check its result; the graph is written unsimplified")
            return graph
        except Exception as exc:  # a third-party optimiser: its failure must not lose the export
            log.warning("--simplify: %s failed (%s); the graph is written unsimplified", name, exc)
            return graph
    log.info("--simplify: skipped (neither %s is installed: pip install onnxslim)", " nor ".join(SIMPLIFIERS))
    return graph


def require_openvino():
    """The `openvino` package, or ConfigError saying how to get it."""
    try:
        import openvino
    except ImportError:
        raise ConfigError(
            "OpenVINO export needs the openvino package, which is not installed (pip install openvino)"
        ) from None
    return openvino


def _openvino(
    module: nn.Module, example: torch.Tensor, folder: Path, options: ExportOptions, model: DetectionModel
) -> None:
    """`folder`/<stem>.xml + .bin + metadata.yaml, converted from the torch module by OpenVINO's PyTorch
    frontend; the folder is built beside its final name and renamed onto it (a failed export leaves
    any earlier folder as it was)."""
    ov = require_openvino()
    shape = [-1, 3, -1, -1] if options.dynamic else list(example.shape)
    with torch.inference_mode(False), torch.no_grad():
        converted = ov.convert_model(module, example_input=example, input=[ov.PartialShape(shape)])
    converted.inputs[0].get_tensor().set_names({INPUT_NAME})
    converted.outputs[0].get_tensor().set_names({OUTPUT_NAME})
    stem = folder.name.removesuffix(SUFFIXES["openvino"])
    folder.parent.mkdir(parents=True, exist_ok=True)
    building = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(building, ignore_errors=True)
    try:
        building.mkdir()
        ov.save_model(converted, str(building / f"{stem}.xml"), compress_to_fp16=False)
        metadata = {
            "stride": int(max(model.stride.tolist())),
            "names": dict(enumerate(map(str, model.names))),
        }
        (building / OPENVINO_METADATA).write_text(yaml.safe_dump(metadata, sort_keys=False), encoding="utf-8")
        previous = folder.with_name(f".{folder.name}.{os.getpid()}.old")
        if folder.exists():
            folder.rename(previous)
        building.rename(folder)
        shutil.rmtree(previous, ignore_errors=True)
    finally:
        shutil.rmtree(building, ignore_errors=True)
