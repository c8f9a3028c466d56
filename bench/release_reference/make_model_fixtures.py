"""Regenerates tests/fixtures/release_models/ by running the YOLOv5 release's OWN code (the PyPI package
`yolov5` 7.0.14, installed only in the throwaway image of bench/release_reference/Dockerfile). Nothing of
the release is copied into the repository: this script only imports it and writes numbers and checkpoints.

    docker build -q --build-arg BASE_IMAGE=<stand-in or training image> -t yolov5-smddp-release-ref:7.0.14 \
        bench/release_reference
    docker run --rm -e PYTHONPATH=/src -v "$PWD:/src:ro" -v "$PWD/tests/fixtures/release_models:/out" -w /tmp \
        --entrypoint python3 yolov5-smddp-release-ref:7.0.14 /src/bench/release_reference/make_model_fixtures.py /out

Writes:
- `yaml_reference.json`: for each of the release's detection yamls (models/*.yaml, models/hub/*.yaml):
  the parameter count at nc 80, the strides, the (smaller) multiples its outputs were taken at, and its
  layer table (the rows as yaml.safe_load reads them; no comments) for the tests to build it from.
- `yaml_outputs.pt`: for each yaml, built at depth_multiple <= 0.33 and width_multiple <= 0.25 (every yaml's
  wiring, at a size a unit test can run), filled by tests/support/fixed_weights.fill_fixed: the eval
  output on fixed_input() (128x128), columns 0..7 (box, objectness, 3 classes) and the sum of all class
  columns per row.
- `*.pt`: checkpoints pickled by the release's torch.save of its own model classes, the way its train.py
  saves them (`model` / `ema` as half-precision model objects, optimizer, opt, ...; most then passed
  through its strip_optimizer like a finished run's best.pt), and `checkpoint_outputs.pt` with each one's
  eval output on fixed_input(64, 64), computed by the release's model from the stored (half) weights.
"""

from __future__ import annotations

import json
import os
import sys
import types
from copy import deepcopy
from datetime import datetime
from pathlib import Path

os.environ.setdefault(
    "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1"
)  # the release's strip_optimizer uses torch.load

import torch  # noqa: E402
import yaml  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))
from fixed_weights import fill_fixed, fixed_input  # noqa: E402

SMALL_DEPTH, SMALL_WIDTH = 0.33, 0.25
_TABLE_KEYS = ("nc", "depth_multiple", "width_multiple", "anchors", "backbone", "head")

# the older layouts (facts of the v3.0 and v5.0 releases' yolov5s.yaml): Focus stem, SPP, and BottleneckCSP
# (v3.0) or C3 (v5.0); the head as in v7.0
_OLD_HEAD = [
    [-1, 1, "Conv", [512, 1, 1]],
    [-1, 1, "nn.Upsample", ["None", 2, "nearest"]],
    [[-1, 6], 1, "Concat", [1]],
    [-1, 3, "CSP", [512, False]],
    [-1, 1, "Conv", [256, 1, 1]],
    [-1, 1, "nn.Upsample", ["None", 2, "nearest"]],
    [[-1, 4], 1, "Concat", [1]],
    [-1, 3, "CSP", [256, False]],
    [-1, 1, "Conv", [256, 3, 2]],
    [[-1, 14], 1, "Concat", [1]],
    [-1, 3, "CSP", [512, False]],
    [-1, 1, "Conv", [512, 3, 2]],
    [[-1, 10], 1, "Concat", [1]],
    [-1, 3, "CSP", [1024, False]],
    [[17, 20, 23], 1, "Detect", ["nc", "anchors"]],
]
_OLD_BACKBONE = [
    [-1, 1, "Focus", [64, 3]],
    [-1, 1, "Conv", [128, 3, 2]],
    [-1, 3, "CSP", [128]],
    [-1, 1, "Conv", [256, 3, 2]],
    [-1, 9, "CSP", [256]],
    [-1, 1, "Conv", [512, 3, 2]],
    [-1, 9, "CSP", [512]],
    [-1, 1, "Conv", [1024, 3, 2]],
    [-1, 1, "SPP", [1024, [5, 9, 13]]],
    [-1, 3, "CSP", [1024, False]],
]
_P5_ANCHORS = [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]]


def old_layout(csp: str, width: float) -> dict:
    rows = [[f, n, csp if m == "CSP" else m, a] for f, n, m, a in _OLD_BACKBONE + _OLD_HEAD]
    return {
        "nc": 80,
        "depth_multiple": 0.33,
        "width_multiple": width,
        "anchors": deepcopy(_P5_ANCHORS),
        "backbone": rows[:10],
        "head": rows[10:],
    }


def as_loaded(config: dict) -> dict:
    """The dict the release's Model stores: what yaml.safe_load gives for it (the string 'None')."""
    return yaml.safe_load(yaml.safe_dump(config, sort_keys=False))


def github_names(common: types.ModuleType, yolo: types.ModuleType) -> None:
    """Pickle the release's classes under the names a GitHub-release checkpoint has (models.common.Conv,
    models.yolo.DetectionModel), not the PyPI package's (yolov5.models...)."""
    sys.modules.setdefault("models", types.ModuleType("models"))
    for module, name in ((common, "models.common"), (yolo, "models.yolo")):
        sys.modules[name] = module
        for obj in vars(module).values():
            if isinstance(obj, type) and obj.__module__ == module.__name__:
                obj.__module__ = name


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/out")
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    import yolov5
    from yolov5.models import common, yolo
    from yolov5.models.yolo import Model
    from yolov5.utils.general import strip_optimizer
    from yolov5.utils.torch_utils import ModelEMA, de_parallel

    root = Path(yolov5.__file__).parent / "models"

    def build(config: dict | Path, nc: int = 80):
        common.Conv.default_act = torch.nn.SiLU()  # the release sets it per yaml and never resets it
        model = Model(config if isinstance(config, dict) else str(config), ch=3, nc=nc)
        return model

    # 1. every detection yaml: parameters at nc 80 and outputs of a small, fixed-weight version
    reference, outputs = {}, {}
    paths = sorted(root.glob("*.yaml")) + sorted((root / "hub").glob("*.yaml"))
    for path in paths:
        config = yaml.safe_load(path.read_text())
        if "backbone" not in config:
            continue  # hub/anchors.yaml
        model = build(path)
        params = sum(p.numel() for p in model.parameters())
        small = dict(config)
        small["depth_multiple"] = min(config["depth_multiple"], SMALL_DEPTH)
        small["width_multiple"] = min(config["width_multiple"], SMALL_WIDTH)
        small_model = fill_fixed(build(small)).eval()
        with torch.no_grad():
            pred = small_model(fixed_input())[0][0]
        outputs[path.name] = {"head": pred[:, :8].contiguous(), "class_sum": pred[:, 5:].sum(-1)}
        reference[path.name] = {
            "path": str(path.relative_to(root.parent)),
            "params": params,
            "stride": model.stride.tolist(),
            "outputs_at": {k: small[k] for k in ("depth_multiple", "width_multiple")},
            "small_params": sum(p.numel() for p in small_model.parameters()),
            # the layer table (facts: rows as yaml.safe_load reads them, comments dropped)
            "config": {k: config[k] for k in (*_TABLE_KEYS, "activation") if k in config},
        }
        print(f"{path.name:28} {params:>12,} params  strides {model.stride.tolist()}", flush=True)
    (out / "yaml_reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    torch.save(outputs, out / "yaml_outputs.pt")

    # 2. checkpoints pickled by the release
    def hub(name: str, width: float | None = None) -> dict:
        config = yaml.safe_load((root / "hub" / name).read_text())
        if width is not None:
            config["width_multiple"] = width
        return config

    fixtures = [  # (file, config, github names, strip_optimizer, what the old releases did differently)
        ("yolov5s-ghost_w0125.pt", hub("yolov5s-ghost.yaml", 0.125), False, False, None),
        ("yolov5n.pt", yaml.safe_load((root / "yolov5n.yaml").read_text()), True, True, None),
        ("yolov5n6.pt", hub("yolov5n6.yaml"), True, True, None),
        ("yolov5s-transformer_w0125.pt", hub("yolov5s-transformer.yaml", 0.125), True, True, None),
        ("yolov5s-LeakyReLU_w0125.pt", hub("yolov5s-LeakyReLU.yaml", 0.125), True, True, None),
        ("yolov3-tiny_w025.pt", hub("yolov3-tiny.yaml", 0.25), True, True, None),
        ("yolov5-p2_w0125.pt", hub("yolov5-p2.yaml", 0.125), True, True, None),
        ("v5.0-layout_w0125.pt", old_layout("C3", 0.125), True, True, "v5.0"),
        ("v3.0-layout_w0125.pt", old_layout("BottleneckCSP", 0.125), True, True, "v3.0"),
    ]
    results = {}
    for index, (name, config, github, strip, old) in enumerate(fixtures):
        if github and index and not fixtures[index - 1][2]:
            github_names(common, yolo)
        model = build(as_loaded(config))
        if old == "v3.0":  # v3.0's Conv used Hardswish and its BottleneckCSP LeakyReLU(0.1); no yaml key
            for module in model.modules():
                if isinstance(module, common.Conv) and not isinstance(module.act, torch.nn.Identity):
                    module.act = torch.nn.Hardswish()
                if isinstance(module, common.BottleneckCSP):
                    module.act = torch.nn.LeakyReLU(0.1)
        fill_fixed(model)
        names = {i: f"class{i}" for i in range(model.yaml["nc"])}
        model.names, model.nc = names, model.yaml["nc"]
        model.hyp = {"lr0": 0.01, "box": 0.05, "cls": 0.5, "obj": 1.0, "anchor_t": 4.0}
        reference_model = deepcopy(model).half().float().eval()  # the stored (half) weights, in float32
        image = fixed_input(64, 64)
        with torch.no_grad():
            pred = reference_model(image)[0][0]
        if old is not None:  # v3.0-v5.0 Detect kept its anchor grid as a buffer (in the state dict)
            detect = model.model[-1]
            del detect.anchor_grid
            grid = detect.anchors.clone().view(detect.nl, 1, -1, 1, 1, 2) * detect.stride.view(
                -1, 1, 1, 1, 1, 1
            )
            detect.register_buffer("anchor_grid", grid)
        ema = ModelEMA(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
        ckpt = {
            "epoch": 0,
            "best_fitness": 0.0,
            "model": deepcopy(de_parallel(model)).half(),
            "ema": deepcopy(ema.ema).half(),
            "updates": ema.updates,
            "optimizer": optimizer.state_dict(),
            "opt": {"weights": "", "cfg": name, "imgsz": 640, "epochs": 1},
            "git": {"remote": "", "branch": "", "commit": ""},
            "date": datetime(2022, 11, 22).isoformat(),
        }
        torch.save(ckpt, out / name)
        if strip:
            strip_optimizer(out / name)
        results[name] = {
            "pred": pred.contiguous(),
            "params": sum(p.numel() for p in model.parameters()),
            "stride": model.stride.tolist(),
            "input_hw": [64, 64],
            "stripped": strip,
            "class_module": type(model).__module__,
        }
        size = (out / name).stat().st_size
        print(
            f"{name:32} {results[name]['params']:>10,} params  {size / 1e6:.2f} MB  {type(model).__module__}"
        )
    torch.save(results, out / "checkpoint_outputs.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
