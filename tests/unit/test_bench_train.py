import json

import pytest
import torch

from yolov5_smddp.benchmarks import timing
from yolov5_smddp.benchmarks.mfu import model_flop_utilisation, peak_tflops, training_flops_per_sample
from yolov5_smddp.benchmarks.timing import PhaseClock
from yolov5_smddp.benchmarks.train import Combination, combinations, summarise
from yolov5_smddp.errors import ConfigError

RESULT_FIELDS = {
    "first_step_ms",
    "host_ms",
    "ops_per_step",
    "batch",
    "amp",
    "channels_last",
    "samples_per_s_per_gpu",
    "samples_per_s_total",
    "step_ms",
    "data_wait_ms",
    "forward_backward_ms",
    "optimizer_ms",
    "comm_ms",
    "device_busy",
    "peak_memory_mb",
    "achieved_tflops",
    "mfu",
}


def test_combinations_batch_outermost():
    combos = combinations([16, 32], ["bf16", "fp16"], [True])
    assert combos == [
        Combination(batch=16, amp="bf16", channels_last=True),
        Combination(batch=16, amp="fp16", channels_last=True),
        Combination(batch=32, amp="bf16", channels_last=True),
        Combination(batch=32, amp="fp16", channels_last=True),
    ]


def test_peak_lookup_by_gpu_name():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA A100-SXM4-40GB") == 312.0
    assert peak_tflops("cpu x86_64") is None
    assert peak_tflops("cpu x86_64", 2.5) == 2.5
    with pytest.raises(ConfigError, match="peak-tflops"):
        peak_tflops("NVIDIA H100", 0)


def test_mfu_exact():
    # YOLOv5x at 640: ~617 GFLOPs per training sample; 320 samples/s on a 989 TFLOP/s GPU
    assert model_flop_utilisation(617e9, 320.0, 989.0) == pytest.approx(617e9 * 320 / 989e12)
    assert model_flop_utilisation(617e9, 320.0, None) is None


def test_summarise_per_step_means():
    combo = Combination(batch=8, amp="bf16", channels_last=True)
    r = summarise(
        combo,
        iters=4,
        wall_s=2.0,
        data_wait_s=0.4,
        forward_backward_s=1.2,
        optimizer_s=0.4,
        peak_memory_mb=100.0,
        flops_per_sample=1e12,
        peak=10.0,
        host_s=0.8,
        ops_per_step=1234,
    )
    assert r.host_ms == pytest.approx(200.0) and r.ops_per_step == 1234
    assert r.samples_per_s_per_gpu == 16.0 and r.samples_per_s_total == 16.0
    assert r.step_ms == 500.0
    assert r.data_wait_ms == pytest.approx(100.0)
    assert r.forward_backward_ms == pytest.approx(300.0)
    assert r.optimizer_ms == pytest.approx(100.0)
    assert r.device_busy == pytest.approx(0.8)
    assert r.achieved_tflops == pytest.approx(16.0)
    assert r.mfu == pytest.approx(1.6)
    assert r.comm_ms is None


def test_training_flops_counted_on_meta_device():
    from yolov5_smddp.models.yolo import build_model

    train, forward = training_flops_per_sample(lambda: build_model("yolov5n"), 64)
    # yolov5n: 4.5 GFLOPs forward at 640 → 1/100 of it at 64; the backward is about twice the forward
    assert forward == pytest.approx(4.47e7, rel=0.02)
    assert 2.5 * forward < train < 3.0 * forward


def test_phase_clock_cpu(monkeypatch):
    # a scripted clock: step k starts at 10k s, its forward/backward lasts k + 1 s, its optimizer 0.25 s
    marks = iter([t for k in range(3) for t in (10.0 * k, 10.0 * k + k + 1, 10.0 * k + k + 1.25)] + [40.0])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(marks))
    clock = PhaseClock("cpu")
    for _ in range(3):
        clock.start()
        clock.after_backward()
        clock.after_optimizer()
    clock.start()  # an unfinished step is not counted
    totals = clock.totals()
    assert totals.steps == 3
    assert totals.forward_backward_s == 1.0 + 2.0 + 3.0
    assert totals.optimizer_s == 0.75 and totals.busy_s == 6.75


def run_bench(tmp_path, *extra):
    from yolov5_smddp.cli import main

    out = tmp_path / "train.json"
    rc = main(
        [
            "bench",
            "train",
            "--cfg",
            "yolov5n",
            "--imgsz",
            "64",
            "--batch-per-gpu",
            "2",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--device",
            "cpu",
            "--peak-tflops",
            "1",
            "--json",
            str(out),
            *extra,
        ]
    )
    assert rc == 0
    return json.loads(out.read_text())


def test_bench_train_cpu_writes_json(tmp_path, capsys):
    report = run_bench(tmp_path, "--amp", "off", "--channels-last", "off")
    assert report["cfg"] == "yolov5n" and report["loader"] == "device" and report["failures"] == []
    assert report["train_flops_per_sample"] > report["forward_flops_per_sample"] > 0
    rows = report["results"]
    assert [(r["amp"], r["channels_last"]) for r in rows] == [("off", False)]
    for r in rows:
        assert set(r) == RESULT_FIELDS
        for key in (
            "samples_per_s_per_gpu",
            "step_ms",
            "forward_backward_ms",
            "optimizer_ms",
            "peak_memory_mb",
            "achieved_tflops",
            "mfu",
        ):
            assert r[key] > 0, key
        assert r["data_wait_ms"] >= 0
        assert r["samples_per_s_per_gpu"] == pytest.approx(2 / (r["step_ms"] / 1e3))
        assert r["forward_backward_ms"] + r["optimizer_ms"] <= r["step_ms"] * 1.001
        assert 0 < r["host_ms"] <= r["step_ms"] * 1.001 and r["first_step_ms"] > 0
        # yolov5n at 64 px, batch 2: ~1,500 operators per step with the fused optimizer and foreach EMA;
        # a per-tensor optimizer, guard or EMA loop would add several hundred (177+ tensors each)
        assert 1000 < r["ops_per_step"] < 1700, r["ops_per_step"]
    out = capsys.readouterr().out
    assert "img/s/GPU" in out and "ops" in out


@pytest.mark.slow
def test_bench_train_real_loader_on_synthetic_data(tmp_path):
    report = run_bench(
        tmp_path, "--amp", "bf16", "--channels-last", "on", "--loader", "real", "--workers", "1"
    )
    (row,) = report["results"]
    assert report["loader"] == "real" and row["channels_last"] is True
    assert row["samples_per_s_per_gpu"] > 0 and row["data_wait_ms"] > 0


def test_bench_train_times_the_colour_on_the_device_batch(tmp_path):
    """`--color-aug device`: the staged batches carry colour parameters and the step applies them (on
    CPU that costs far more than the workers' OpenCV, which is why `auto` keeps them there)."""
    from yolov5_smddp.benchmarks import inputs
    from yolov5_smddp.config.hyp import Hyp, load_hyp

    staged = inputs.staged_synthetic(
        2, 64, 3, torch.device("cpu"), hyp=Hyp.from_dict(load_hyp("scratch-low"))
    )
    assert all(color is not None and color.shape == (2, 6) for _, _, color in staged)
    assert all(color is None for _, _, color in inputs.staged_synthetic(2, 64, 3, torch.device("cpu")))
    plain = run_bench(tmp_path / "plain", "--amp", "off", "--channels-last", "off")
    device = run_bench(tmp_path / "device", "--amp", "off", "--channels-last", "off", "--color-aug", "device")
    assert plain["color_on_device"] is False and device["color_on_device"] is True
    assert device["results"][0]["samples_per_s_per_gpu"] > 0


def test_bench_train_refuses_bad_imgsz_and_fp16_on_cpu():
    from yolov5_smddp.cli import main

    assert main(["bench", "train", "--cfg", "yolov5n", "--imgsz", "100", "--device", "cpu"]) == 2
    assert (
        main(["bench", "train", "--cfg", "yolov5n", "--imgsz", "64", "--amp", "fp16", "--device", "cpu"]) == 2
    )


def test_bench_and_trainer_build_the_same_training_stack():
    """Label smoothing and the weight-decay scaling come from one builder: `bench train` at batch 48 on one
    GPU gets what a 1-rank training run with the default options gets."""
    import torch

    from yolov5_smddp.benchmarks.train import bench_training_stack
    from yolov5_smddp.config.batch import plan_batch
    from yolov5_smddp.config.hyp import Hyp, load_hyp
    from yolov5_smddp.config.train_config import TrainConfig
    from yolov5_smddp.models.yolo import build_model
    from yolov5_smddp.train.engine import resolve_amp
    from yolov5_smddp.train.optim_recipe import build_training_stack

    hyp = Hyp.from_dict(load_hyp("scratch-low"))
    amp = resolve_amp("off", "cpu", None)
    config = TrainConfig(batch_size=48)
    plan = plan_batch(config.batch_size, config.batch_per_gpu, 1)

    def stacks(label_smoothing: float):
        torch.manual_seed(0)
        model = build_model("yolov5n", nc=3)
        trained = build_training_stack(
            model,
            hyp,
            nc=3,
            imgsz=320,
            global_batch=plan.global_batch,
            amp=amp,
            optimizer=config.optimizer,
            label_smoothing=label_smoothing,
        )
        benched = bench_training_stack(model, hyp, nc=3, imgsz=320, batch=48, amp=amp)
        return trained, benched

    trained, benched = stacks(config.label_smoothing)
    decay = [(g["name"], g["weight_decay"]) for g in benched.optimizer.param_groups]
    assert decay == [(g["name"], g["weight_decay"]) for g in trained.optimizer.param_groups]
    assert decay == [("bias", 0.0), ("weight", pytest.approx(hyp.weight_decay * 48 / 64)), ("norm", 0.0)]
    assert benched.accumulate == trained.accumulate == 1
    assert benched.hyp == trained.hyp
    assert (benched.criterion.cls_pos, benched.criterion.cls_neg) == (1.0, 0.0)
    assert benched.criterion.gains == trained.criterion.gains
    assert type(benched.optimizer) is type(trained.optimizer) is torch.optim.SGD
    smoothed, _ = stacks(0.1)
    assert (smoothed.criterion.cls_pos, smoothed.criterion.cls_neg) == pytest.approx((0.95, 0.05))
