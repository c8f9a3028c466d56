"""Sharded validation's pure parts (valshard), the packing of match results for the gather, and the
full-precision box decode under autocast."""

import multiprocessing
import socket

import pytest
import torch

from yolov5_smddp.detection.metrics import MetricAccumulator, metrics_from_state, pack_state, unpack_states
from yolov5_smddp.distributed import process_group
from yolov5_smddp.distributed.valshard import ContiguousSampler, shard_batches, shard_images, split_summary
from yolov5_smddp.models.detect import Detect
from yolov5_smddp.train.engine import AmpPolicy, evaluate

# ------------------------------------------------------------------------------------------- shards


def test_shard_batches_even_and_uneven_blocks():
    assert [shard_batches(4, 2, r) for r in range(2)] == [range(0, 2), range(2, 4)]
    assert [shard_batches(5, 2, r) for r in range(2)] == [range(0, 3), range(3, 5)]
    assert [shard_batches(7, 3, r) for r in range(3)] == [range(0, 3), range(3, 5), range(5, 7)]
    # more ranks than batches: the last ranks validate nothing
    assert [shard_batches(2, 4, r) for r in range(4)] == [range(0, 1), range(1, 2), range(2, 2), range(2, 2)]
    assert shard_batches(0, 2, 1) == range(0, 0)
    assert shard_batches(9, 1, 0) == range(0, 9)


def test_shard_batches_cover_everything_once_in_order():
    for batches in range(0, 40):
        for world in range(1, 9):
            joined = [b for r in range(world) for b in shard_batches(batches, world, r)]
            assert joined == list(range(batches))
            sizes = [len(shard_batches(batches, world, r)) for r in range(world)]
            assert max(sizes) - min(sizes) <= 1


def test_shard_batches_rejects_bad_rank():
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        shard_batches(4, 2, 2)


def test_shard_images_whole_batches_last_short():
    # 30 images in batches of 8 → batches 8, 8, 8, 6; two ranks take 2 batches each
    assert shard_images(30, 8, 2, 0) == range(0, 16)
    assert shard_images(30, 8, 2, 1) == range(16, 30)
    assert [len(shard_images(5000, 64, 64, r)) for r in (0, 14, 15, 63)] == [128, 128, 64, 8]
    assert sum(len(shard_images(5000, 64, 64, r)) for r in range(64)) == 5000


def test_split_summary_lines():
    assert split_summary(30, 15, 2) == "15 of 30 images on each of 2 ranks"
    assert split_summary(30, 8, 2) == "images per rank 16/14 of 30 on 2 ranks"
    assert split_summary(8, 16, 1) == "8 of 8 images on 1 rank"


def test_contiguous_sampler_yields_its_range():
    sampler = ContiguousSampler(range(16, 30))
    sampler.set_epoch(3)
    assert len(sampler) == 14 and list(sampler) == list(range(16, 30))


# --------------------------------------------------------------------------------- gathered metrics


def _accumulate(images) -> MetricAccumulator:
    acc = MetricAccumulator()
    for dets, gt_boxes, gt_cls in images:
        acc.update(dets, gt_boxes, gt_cls)
    return acc


def _random_images(n: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    images = []
    for _ in range(n):
        m = int(torch.randint(0, 4, (1,), generator=g))
        xy = torch.rand(m, 2, generator=g) * 200
        gt = torch.cat([xy, xy + 20 + torch.rand(m, 2, generator=g) * 40], 1)
        gt_cls = torch.randint(0, 3, (m,), generator=g).float()
        k = int(torch.randint(0, 6, (1,), generator=g))
        boxes = torch.cat(
            [gt, torch.rand(max(k - m, 0), 4, generator=g) * 100 + torch.tensor([0, 0, 50, 50])]
        )
        boxes = boxes[:k] + torch.randn(min(k, boxes.shape[0]), 4, generator=g) * 3
        conf = torch.rand(boxes.shape[0], generator=g).round(decimals=2)  # ties across images
        cls = torch.randint(0, 3, (boxes.shape[0],), generator=g).float()
        images.append((torch.cat([boxes, conf[:, None], cls[:, None]], 1), gt, gt_cls))
    return images


def test_pack_unpack_in_rank_order_equals_one_accumulator():
    images = _random_images(30, seed=1)
    whole = _accumulate(images).compute()
    parts = [_accumulate(images[:16]), _accumulate(images[16:])]
    packed = [pack_state(p.state()) for p in parts]
    state = unpack_states([p for p, _ in packed], [t for _, t in packed])
    merged = metrics_from_state(state, 30)
    assert whole.map50 > 0.1  # a non-trivial case
    for key in ("precision", "recall", "map50", "map50_95", "best_conf", "num_images", "num_targets"):
        assert getattr(merged, key) == getattr(whole, key), key
    assert merged.per_class_ap50_95 == whole.per_class_ap50_95
    assert merged.per_class(["a", "b", "c"]) == whole.per_class(["a", "b", "c"])
    assert sum(merged.per_class_images.values()) > len(merged.per_class_images)  # counts, not flags


def test_pack_state_of_an_empty_shard():
    predictions, targets = pack_state(MetricAccumulator().state())
    assert predictions.shape == (0, 12) and targets.shape == (0, 2)
    assert predictions.dtype == torch.float32


# ------------------------------------------------------------------------------- fp32 box decode


def _detect(nc: int = 2) -> Detect:
    anchors = [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]]
    return Detect(nc, anchors, ch=[3 * (nc + 5)] * 3, strides=[8, 16, 32]).eval()


def _bf16_logits(shape, seed: int) -> torch.Tensor:
    """Logits representable in bf16, so both decodes see the same input."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 2).to(torch.bfloat16).float()


def decode_error_px(detect: Detect, imgsz: int, decode_in: torch.dtype | None) -> float:
    """Largest |xywh| difference in pixels between the fp32 decode and the decode under CPU bf16 autocast
    (decode_in=None) or of bf16 logits decoded in bf16 arithmetic (decode_in=torch.bfloat16: the old
    behaviour), over all three levels of an imgsz × imgsz input."""
    worst = 0.0
    for level, stride in enumerate(detect.strides):
        n = imgsz // int(stride)
        raw = _bf16_logits((1, detect.na, n, n, detect.no), seed=level)
        reference = detect.decode(level, raw)
        if decode_in is None:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                other = detect.decode(level, raw.to(torch.bfloat16))
        else:
            other = detect._decode_float32(level, raw.to(decode_in)).float()
        worst = max(worst, float((other[..., :4].float() - reference[..., :4]).abs().max()))
    return worst


def test_decode_under_bf16_autocast_equals_fp32_within_001_px():
    detect = _detect()
    assert decode_error_px(detect, 640, None) <= 0.01
    # what decoding in bf16 arithmetic did (the old behaviour): steps of pixels at 640
    assert decode_error_px(detect, 640, torch.bfloat16) > 1.0


def test_detect_forward_under_autocast_returns_float32_boxes():
    detect = _detect()
    xs = [torch.randn(1, detect.na * detect.no, n, n) for n in (8, 4, 2)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pred, raw = detect(xs)
    assert pred.dtype == torch.float32 and raw[0].dtype == torch.bfloat16
    expected = torch.cat([detect.decode(i, r.float()) for i, r in enumerate(raw)], 1)
    assert torch.equal(pred, expected)


class OracleDetector(torch.nn.Module):
    """A 'model' whose Detect head (identity 1×1 convs) receives, per batch, logits that decode exactly
    to the ground-truth boxes (objectness and class logits high), so mAP is 1 at every IoU threshold
    when the decode is exact. The convs run under autocast like a real model's."""

    def __init__(self, detect: Detect, features: list[list[torch.Tensor]]) -> None:
        super().__init__()
        self.detect = detect
        self.features = features
        self.calls = 0
        with torch.no_grad():
            for conv in detect.m:
                channels = conv.weight.shape[0]
                conv.weight.copy_(torch.eye(channels).view(channels, channels, 1, 1))
                conv.bias.zero_()

    def forward(self, x):
        out = self.detect(self.features[self.calls])
        self.calls += 1
        return out


def _logit(p: torch.Tensor) -> torch.Tensor:
    return torch.log(p / (1 - p))


def _oracle_batches(detect: Detect, imgsz: int, n_images: int, seed: int):
    """Small boxes (8-40 px) placed on the stride-8 level, one per anchor-0 cell at random cells."""
    g = torch.Generator().manual_seed(seed)
    features, batches = [], []
    sizes = [imgsz // int(s) for s in detect.strides]
    for _ in range(n_images):
        levels = [torch.full((1, detect.na, n, n, detect.no), -12.0) for n in sizes]
        rows = []
        for _ in range(12):
            cy, cx = (int(v) for v in torch.randint(2, sizes[0] - 2, (2,), generator=g))
            off = torch.rand(2, generator=g) * 0.9 + 0.05  # cell offset in (0.05, 0.95)
            wh = torch.rand(2, generator=g) * 32 + 8
            anchor = detect.anchors[0, 0] * detect.strides[0]
            s_xy = (off + 0.5) / 2
            s_wh = (wh / anchor).sqrt() / 2
            cell = levels[0][0, 0, cy, cx]
            if cell[4] > 0:
                continue  # already used
            cell[:2] = _logit(s_xy)
            cell[2:4] = _logit(s_wh.clamp(0.01, 0.99))
            cell[4] = 8.0
            cls = int(torch.randint(0, detect.nc, (1,), generator=g))
            cell[5 + cls] = 8.0
            xy = (torch.tensor([cx, cy]) + off) * detect.strides[0]
            real_wh = (2 * torch.sigmoid(cell[2:4])) ** 2 * anchor
            rows.append([cls, *(xy / imgsz).tolist(), *(real_wh / imgsz).tolist()])
        feats = [
            lv.permute(0, 1, 4, 2, 3).reshape(1, detect.na * detect.no, n, n) for lv, n in zip(levels, sizes)
        ]
        features.append(feats)
        targets = torch.tensor([[0, *r] for r in rows], dtype=torch.float32)
        imgs = torch.zeros((1, 3, imgsz, imgsz), dtype=torch.uint8)
        batches.append((imgs, targets, (f"img{len(batches)}.jpg",), (((imgsz, imgsz), None),), None))
    return features, batches


def _oracle_map(amp: AmpPolicy, seed: int = 0) -> float:
    detect = _detect(nc=3)
    features, batches = _oracle_batches(detect, 640, 6, seed)
    model = OracleDetector(detect, features)
    return evaluate(model, batches, device=torch.device("cpu"), amp=amp).map50_95


def test_val_map_under_bf16_autocast_equals_fp32():
    fp32 = _oracle_map(AmpPolicy("off", "cpu"))
    bf16 = _oracle_map(AmpPolicy("bf16", "cpu"))
    assert fp32 > 0.99  # the oracle is (nearly) perfect in fp32
    assert abs(bf16 - fp32) <= 1e-3, (bf16, fp32)


def test_decode_error_reference_numbers():
    # docs/PERFORMANCE.md's table comes from decode_error_px: 0.0 px after (the float32 decode under bf16
    # autocast is the fp32 decode exactly), 14.7 px before (decoding in bf16 arithmetic) at 640 px
    detect = _detect()
    assert decode_error_px(detect, 640, None) == 0.0 and decode_error_px(detect, 320, None) == 0.0
    assert decode_error_px(detect, 640, torch.bfloat16) == pytest.approx(14.7, abs=0.05)


# ------------------------------------------------------------------- the gather with 2 Gloo processes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _gather_worker(rank: int, port: int, stop_rank: int | None, queue) -> None:
    torch.set_num_threads(1)
    info = process_group.DistInfo(rank, rank, 2, 2, 0, "127.0.0.1", port, "torchrun", use_libuv=False)
    process_group.init(info, "gloo", "cpu", 60.0)
    try:
        detect = _detect(nc=3)
        features, batches = _oracle_batches(detect, 640, 6, seed=5)
        _noisy(features)
        mine = range(0, 3) if rank == 0 else range(3, 6)  # shard_batches(6, 2, rank)
        model = OracleDetector(detect, [features[i] for i in mine])
        result = evaluate(
            model,
            [batches[i] for i in mine],
            device=torch.device("cpu"),
            amp=AmpPolicy("off", "cpu"),
            should_stop=lambda: rank == stop_rank,
            gather=True,
        )
        queue.put((rank, None if result is None else result.to_dict()))
    finally:
        process_group.destroy()


def _noisy(features) -> None:
    """Move the oracle's boxes a little, so the metrics are not all 1."""
    g = torch.Generator().manual_seed(9)
    for feats in features:
        feats[0] += torch.randn(feats[0].shape, generator=g) * 0.3


def _two_ranks(stop_rank: int | None) -> dict:
    ctx = multiprocessing.get_context("spawn")  # fork from a threaded pytest may deadlock
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_gather_worker, args=(r, port, stop_rank, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    return results


def test_two_gloo_ranks_gather_equal_one_process():
    detect = _detect(nc=3)
    features, batches = _oracle_batches(detect, 640, 6, seed=5)
    _noisy(features)
    alone = evaluate(
        OracleDetector(detect, features), batches, device=torch.device("cpu"), amp=AmpPolicy("off", "cpu")
    ).to_dict()
    assert 0.05 < alone["mAP50-95"] < 0.95
    results = _two_ranks(stop_rank=None)
    assert results[1] is None and results[0] == alone


def test_a_stop_on_one_rank_returns_none_on_both_without_hanging():
    assert _two_ranks(stop_rank=1) == {0: None, 1: None}
