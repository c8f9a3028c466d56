"""bench/cluster_check.py: the verdicts of bench/gpu_cluster_check.sh (val equality, the summary)."""

import json

from bench import cluster_check

VAL = {"precision": 0.5, "recall": 0.25, "mAP50": 0.125, "mAP50-95": 0.0625, "images": 16}


def _val(tmp_path, name, **changes):
    path = tmp_path / name
    path.write_text(json.dumps({**VAL, **changes}))
    return path


def test_val_at_one_and_two_ranks_must_agree(tmp_path):
    one = _val(tmp_path, "one.json")
    cluster_check.compare_val(one, _val(tmp_path, "same.json"), tmp_path / "a.json")
    assert json.loads((tmp_path / "a.json").read_text())["ok"] is True
    cluster_check.compare_val(one, _val(tmp_path, "off.json", mAP50=0.1251), tmp_path / "b.json")
    verdict = json.loads((tmp_path / "b.json").read_text())
    assert verdict["ok"] is False and abs(verdict["max_abs_diff"] - 1e-4) < 1e-9
    cluster_check.compare_val(one, _val(tmp_path, "fewer.json", images=12), tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text())["ok"] is False


def test_summary_fails_a_check_by_exit_code_or_by_its_verdict(tmp_path):
    (tmp_path / "environment.json").write_text(json.dumps({"gpu": "NVIDIA H100", "torch": "2.5.1"}))
    (tmp_path / "checks.tsv").write_text(
        "train1\t0\t30\t1-rank nccl training\nddp2\t0\t20\t2 ranks\nresume\t1\t9\tresume across AMP modes\n"
        "syncs\t0\t15\thost syncs\n"
    )
    (tmp_path / "ddp2.json").write_text(json.dumps({"ok": False}))
    rows = [{"amp": "fp16", "steps": 5, "host_syncs": 10, "per_step": 2.0, "where": ["engine.py:1"]}]
    (tmp_path / "syncs.json").write_text(json.dumps({"ok": False, "rows": rows}))
    cluster_check.summary(tmp_path, tmp_path / "s.md", tmp_path / "s.json")
    checks = {c["check"]: c["ok"] for c in json.loads((tmp_path / "s.json").read_text())["checks"]}
    assert checks == {"train1": True, "ddp2": False, "resume": False, "syncs": False}
    text = (tmp_path / "s.md").read_text()
    assert "| resume | resume across AMP modes | 1 | 9 | FAILED |" in text
    assert "| fp16 | 5 | 10 | 2.00 |" in text


def test_the_teardown_thread_runs_on_the_rank_device(monkeypatch):
    """Issue 52 item 4: teardown's bounded thread sets the rank's CUDA device before leaving the group
    (a new thread starts on device 0)."""
    import threading

    import torch

    from yolov5_smddp.distributed import process_group

    calls = []
    monkeypatch.setattr(
        torch.cuda, "set_device", lambda d: calls.append(("set", str(d), threading.current_thread().name))
    )
    work = process_group.on_device(
        torch.device("cuda", 3), lambda: calls.append(("work", threading.current_thread().name))
    )
    assert process_group.run_bounded(work, 30.0)
    assert calls == [("set", "cuda:3", "yolov5-smddp-teardown"), ("work", "yolov5-smddp-teardown")]
    calls.clear()
    process_group.on_device(torch.device("cpu"), lambda: calls.append("work"))()
    assert calls == ["work"]


def test_stopped_signals_the_run_at_the_end_of_epoch_1_and_checks_its_checkpoint(tmp_path):
    """Issue 52 item 4: the cluster check's resume starts from a run stopped part-way (a finished run is
    refused by --resume): the run is SIGTERMed at epoch 1's metric line, its last.pt must be epoch 1's."""
    import json
    import sys

    import torch

    ckpt = tmp_path / "last.pt"
    torch.save({"epoch": 1}, ckpt)
    job = (
        "import sys, time\n"
        "print('epoch=1 step=1 loss=1', flush=True)\n"
        "print('epoch=1 epochs=2 box_loss=0.1', flush=True)\n"
        "time.sleep(60)\n"
        "print('epoch=2 epochs=2 box_loss=0.1', flush=True)\n"
    )
    out = tmp_path / "stopped.json"
    cluster_check.stopped(str(tmp_path / "log"), str(out), str(ckpt), "2", sys.executable, "-c", job)
    verdict = json.loads(out.read_text())
    assert verdict["signalled_after_epoch_1"] and verdict["checkpoint_epoch"] == 1 and verdict["ok"]
    assert verdict["exit"] != 0  # ended by the signal, not by finishing epoch 2
    assert "epoch=2" not in (tmp_path / "log").read_text()
