import json

import pytest

from bench.scaling import (
    DDP_BUCKET_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    Links,
    allreduce_seconds,
    bucket_ready_fractions,
    ddp_buckets,
    gbps_to_bytes_per_s,
    predict_point,
    predict_scaling,
    ring_allreduce_bytes,
    simulate_overlap,
)


def links(nodes=2, *, inter_latency=0.0, intra_latency=0.0):
    return Links(
        nodes=nodes,
        gpus_per_node=4,
        inter_node_Bps=100.0,
        intra_node_Bps=1000.0,
        inter_node_latency_s=inter_latency,
        intra_node_latency_s=intra_latency,
    )


def test_ddp_limits_are_torch_defaults():
    assert DDP_FIRST_BUCKET_BYTES == 1048576
    assert DDP_BUCKET_BYTES == 26214400


def test_buckets_reverse_order_first_small_then_large():
    # reversed: 4 (3) + 3 (10) = 13 >= 10 closes; 2 (20) + 1 (5) = 25 >= 25 closes; 0 is left over
    assert ddp_buckets([5, 5, 20, 10, 3], first_bucket_bytes=10, bucket_bytes=25) == [[4, 3], [2, 1], [0]]


def test_buckets_one_big_tensor_fills_a_bucket_alone():
    assert ddp_buckets([1, 100, 1], first_bucket_bytes=1, bucket_bytes=50) == [[2], [1], [0]]


def test_buckets_with_torch_default_limits():
    mib = 1024 * 1024
    sizes = [mib // 2, 30 * mib, mib // 2, mib // 2]
    # 3 + 2 = 1 MiB closes the first bucket; 30 MiB alone closes the second; tensor 0 is left over
    assert ddp_buckets(sizes) == [[3, 2], [1], [0]]


def test_ring_volume_is_2_n_minus_1_over_n():
    assert ring_allreduce_bytes(100, 4) == 150
    assert ring_allreduce_bytes(100, 2) == 100
    assert ring_allreduce_bytes(100, 1) == 0


def test_gbps_conversion():
    assert gbps_to_bytes_per_s(400) == 50e9


def test_hierarchical_allreduce_time():
    # intra: 2 * 3/4 * 800 / 1000 = 1.2; inter: 2 * 1/2 * 800 / 100 = 8
    assert allreduce_seconds(800, links(), "hierarchical") == pytest.approx(9.2)
    # + latencies: 2 * 3 * 0.1 intra hops, 2 * 1 * 0.5 inter hops
    assert allreduce_seconds(
        800, links(inter_latency=0.5, intra_latency=0.1), "hierarchical"
    ) == pytest.approx(10.8)


def test_flat_ring_allreduce_time():
    # W = 8: 2 * 7/8 * 800 / min(100, 1000) = 14; + 2 * 7 hops * 0.5
    assert allreduce_seconds(800, links(), "ring") == pytest.approx(14.0)
    assert allreduce_seconds(800, links(inter_latency=0.5), "ring") == pytest.approx(21.0)


def test_one_node_uses_nvlink_only_and_one_gpu_costs_nothing():
    assert allreduce_seconds(800, links(nodes=1), "ring") == pytest.approx(1.2)
    assert allreduce_seconds(800, links(nodes=1), "hierarchical") == pytest.approx(1.2)
    single = Links(
        nodes=1,
        gpus_per_node=1,
        inter_node_Bps=1.0,
        intra_node_Bps=1.0,
        inter_node_latency_s=1.0,
        intra_node_latency_s=1.0,
    )
    assert allreduce_seconds(800, single, "ring") == 0.0


def test_unknown_algorithm_is_refused():
    with pytest.raises(ValueError, match="tree"):
        allreduce_seconds(1, links(nodes=1), "tree")


def test_ready_fractions_follow_backward_work():
    buckets = [[4, 3], [2, 1], [0]]
    # backward order 4, 3, 2, 1, 0 with work 4, 3, 2, 0, 1 of 10: cumulative .4 .7 .9 .9 1.0
    assert bucket_ready_fractions(buckets, [1, 0, 2, 3, 4]) == pytest.approx([0.7, 0.9, 1.0])
    assert bucket_ready_fractions(buckets, [0, 0, 0, 0, 0]) == pytest.approx([0.4, 0.8, 1.0])


def test_overlap_hides_early_buckets_and_exposes_the_tail():
    result = simulate_overlap([1, 2, 10], [3, 1, 2], backward_s=10)
    assert (result.comm_s, result.exposed_s, result.last_end_s) == (6, 2, 12)


def test_overlap_backlog_when_communication_is_slower_than_backward():
    result = simulate_overlap([1, 2, 3], [5, 5, 1], backward_s=4)
    assert (result.exposed_s, result.last_end_s) == (8, 12)


def test_predict_point_efficiency():
    point = predict_point(
        bucket_nbytes=[800],
        ready_fractions=[1.0],
        links=links(),
        algorithm="hierarchical",
        step_s=10,
        backward_fraction=0.5,
        batch_per_gpu=2,
        one_node_step_s=11.2,
    )
    assert point.comm_ms == pytest.approx(9200)
    assert point.exposed_ms == pytest.approx(9200)
    assert point.hidden_fraction == pytest.approx(0.0)
    assert point.step_ms == pytest.approx(19200)
    assert point.efficiency == pytest.approx(10 / 19.2)
    assert point.efficiency_vs_1_node == pytest.approx(11.2 / 19.2)
    assert point.samples_per_s == pytest.approx(16 / 19.2)


def test_predict_scaling_per_node_count():
    points = predict_scaling(
        tensor_bytes=[800],
        tensor_work=[1.0],
        node_counts=[1, 2],
        links=links(),
        algorithm="hierarchical",
        step_s=10,
        backward_fraction=0.5,
        batch_per_gpu=2,
    )
    assert [p.nodes for p in points] == [1, 2]
    assert [p.world_size for p in points] == [4, 8]
    assert points[0].step_ms == pytest.approx(11200)
    assert points[0].efficiency == pytest.approx(10 / 11.2)
    assert points[0].efficiency_vs_1_node == pytest.approx(1.0)
    assert points[1].efficiency_vs_1_node == pytest.approx(11.2 / 19.2)


def test_early_bucket_hidden_last_bucket_exposed():
    mib = 1024 * 1024
    link = Links(
        nodes=2,
        gpus_per_node=4,
        inter_node_Bps=2 * mib,
        intra_node_Bps=20 * mib,
        inter_node_latency_s=0.0,
        intra_node_latency_s=0.0,
    )
    # buckets [[1], [0]] of 2 MiB: 2 * 3/4 / 10 + 1 = 1.15 s each; ready at 20% and 100% of a 5 s backward
    points = predict_scaling(
        tensor_bytes=[2 * mib, 2 * mib],
        tensor_work=[4.0, 1.0],
        node_counts=[2],
        links=link,
        algorithm="hierarchical",
        step_s=10,
        backward_fraction=0.5,
        batch_per_gpu=1,
    )
    assert points[0].comm_ms == pytest.approx(2300)
    assert points[0].exposed_ms == pytest.approx(1150)
    assert points[0].hidden_fraction == pytest.approx(0.5)


def test_bench_scaling_cli_writes_json(tmp_path):
    from bench.scaling import main

    out = tmp_path / "scaling.json"
    rc = main(["--cfg", "yolov5n", "--step-ms", "100", "--nodes", "1,2", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["gradient_bytes"] == 1_872_157 * 4
    assert report["buckets"] >= 2
    rows = report["predictions"]
    assert [(r["algorithm"], r["nodes"]) for r in rows] == [
        ("ring", 1),
        ("ring", 2),
        ("hierarchical", 1),
        ("hierarchical", 2),
    ]
    assert all(0 < r["efficiency"] <= 1 and r["step_ms"] >= 100 for r in rows)


def test_bench_scaling_rejects_bad_step_time():
    from bench.scaling import main

    assert main(["--cfg", "yolov5n", "--step-ms", "0"]) == 2


def test_gradient_profile_work_and_ready_order():
    from torch import nn

    from bench.scaling import gradient_profile

    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1))
    profile = gradient_profile(model, imgsz=8)
    assert profile.numels == [108, 4, 4, 8, 2]
    # conv1: 4 × 8 × 8 outputs × 27 multiply-adds × 2; conv2: 2 × 8 × 8 outputs × 4 × 2
    assert profile.work == [13824.0, 0.0, 0.0, 1024.0, 0.0]
    order = profile.ready_order
    assert set(order[:2]) == {3, 4} and set(order[2:4]) == {1, 2} and order[4] == 0
    assert all(p.grad is None for p in model.parameters())
    assert profile.tensor_bytes(2) == [216, 8, 8, 16, 4]


def test_buckets_follow_a_given_ready_order():
    assert ddp_buckets(
        [5, 5, 20, 10, 3], ready_order=[2, 0, 1, 3, 4], first_bucket_bytes=10, bucket_bytes=25
    ) == [[2], [0, 1, 3, 4]]
    assert bucket_ready_fractions(
        [[2], [0, 1, 3, 4]], [1, 1, 1, 1, 0], ready_order=[2, 0, 1, 3, 4]
    ) == pytest.approx([0.25, 1.0])


def test_overlap_summary_exact():
    from bench.overlap import summarise

    raw = {
        "sync": [[0.1, 0.3], [0.1, 0.5]],
        "sync_local": [[0.1, 0.2], [0.1, 0.2]],
        "no_sync": [[0.1, 0.15], [0.1, 0.15]],
        "bucket_s": [0.05, 0.1],
        "ready": [0.5, 1.0],
        "gradient_bytes": 2_000_000,
        "model_bucket_bytes": [1, 2],
        "ddp_bucket_bytes": [1, 2],
    }
    m = summarise(raw, cfg="yolov5n", imgsz=64, batch=1, iters=2, world_size=2)
    assert m.step_sync_ms == pytest.approx(500) and m.step_sync_local_ms == pytest.approx(300)
    assert m.step_no_sync_ms == pytest.approx(250)
    assert m.measured_exposed_ms == pytest.approx(200)  # sync − sync_local: differences 100 and 300 ms
    assert m.noise_ms == pytest.approx(200)  # 2 × stdev 141.4 / sqrt(2)
    assert m.ddp_overhead_ms == pytest.approx(50)  # sync_local − no_sync
    # backward 200 ms (sync_local): bucket 0 ready at 100 ends at 150; bucket 1 ready at 200 ends at 300
    assert m.backward_ms == pytest.approx(200)
    assert m.predicted_exposed_ms == pytest.approx(100)
    assert m.predicted_if_no_overlap_ms == pytest.approx(150)
    assert m.agrees and m.gradient_mb == 2.0 and m.buckets == 2
    assert m.host_compute_share == 1.0 and m.predicted_with_contention_ms == pytest.approx(
        150
    )  # a CPU backward
    emulated = summarise(raw, cfg="yolov5n", imgsz=64, batch=1, iters=2, world_size=2, emulate_device_ms=150)
    assert emulated.host_compute_share == pytest.approx(
        0.25
    )  # 50 of the 200 ms backward computed by the host
    assert emulated.predicted_with_contention_ms == pytest.approx(100 + 0.25 * (150 - 100))
    assert "bucket sizes equal to DDP's" in m.summary()
