"""Exact EFA/NCCL variables our elastic launcher adds per instance type (yolov5_smddp.sagemaker.efa)."""

import pytest

from yolov5_smddp.sagemaker.efa import network_environment

RDMA = {
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "FI_PROVIDER": "efa",
    "NCCL_PROTO": "simple",
    "NCCL_SOCKET_IFNAME": "eth0",
}
EFA_NO_RDMA = {"FI_PROVIDER": "efa", "NCCL_PROTO": "simple", "NCCL_SOCKET_IFNAME": "eth0"}


@pytest.mark.parametrize(
    ("instance_type", "expected"),
    [
        ("ml.p4d.24xlarge", RDMA),
        ("ml.p4de.24xlarge", RDMA),
        ("ml.p5.48xlarge", RDMA),  # toolkit PR 241
        ("ml.p5e.48xlarge", RDMA),  # toolkit PR 241
        ("ml.trn1.32xlarge", RDMA),
        ("ml.p6e-gb200.36xlarge", RDMA),
        ("ml.p3dn.24xlarge", EFA_NO_RDMA),
        ("ml.g5.48xlarge", EFA_NO_RDMA),
        ("ml.g4dn.12xlarge", EFA_NO_RDMA),
        ("ml.g4dn.8xlarge", EFA_NO_RDMA),
        ("ml.g5.12xlarge", {"NCCL_SOCKET_IFNAME": "eth0"}),  # no EFA: sockets on the SageMaker interface
        ("ml.p3.16xlarge", {"NCCL_SOCKET_IFNAME": "eth0"}),
    ],
)
def test_variables_per_instance_type(instance_type, expected):
    result = network_environment(instance_type, "eth0", {})
    assert result.added == expected
    assert list(result.added) == sorted(expected)  # logged in a stable order
    assert result.kept == {}


@pytest.mark.parametrize("instance_type", [None, "", "local", "local_gpu"])
def test_nothing_outside_real_instances(instance_type):
    # local mode reports eth0/ethwe, which need not exist in the container: NCCL's bootstrap would fail
    result = network_environment(instance_type, "ethwe", {})
    assert result.added == {} and result.kept == {}


def test_log_line_without_additions():
    nothing = network_environment("local", "eth0", {})
    assert nothing.log_line("local") == "network (local): nothing added"
    assert nothing.log_line(None) == "network (unknown instance type): nothing added"


def test_user_values_are_never_replaced_and_are_reported():
    environ = {"NCCL_PROTO": "LL,LL128,Simple", "FI_PROVIDER": "efa", "PATH": "/usr/bin"}
    result = network_environment("ml.p4d.24xlarge", "ens5", environ)
    assert result.added == {"FI_EFA_USE_DEVICE_RDMA": "1", "NCCL_SOCKET_IFNAME": "ens5"}
    assert result.kept == {"FI_PROVIDER": "efa", "NCCL_PROTO": "LL,LL128,Simple"}
    assert result.log_line("ml.p4d.24xlarge") == (
        "network (ml.p4d.24xlarge): FI_EFA_USE_DEVICE_RDMA=1 NCCL_SOCKET_IFNAME=ens5; "
        "already set FI_PROVIDER=efa NCCL_PROTO=LL,LL128,Simple"
    )


def test_an_empty_user_value_still_counts_as_set():
    result = network_environment("ml.p5.48xlarge", "eth0", {"NCCL_SOCKET_IFNAME": ""})
    assert "NCCL_SOCKET_IFNAME" not in result.added and result.kept == {"NCCL_SOCKET_IFNAME": ""}


def test_log_line_of_an_efa_type():
    result = network_environment("ml.p3dn.24xlarge", "eth0", {})
    assert result.log_line("ml.p3dn.24xlarge") == (
        "network (ml.p3dn.24xlarge): FI_PROVIDER=efa NCCL_PROTO=simple NCCL_SOCKET_IFNAME=eth0"
    )


def test_the_elastic_launcher_exports_them_once_before_starting_workers(tmp_path, monkeypatch, caplog):
    import json
    import os

    from yolov5_smddp import launch
    from yolov5_smddp.sagemaker import main

    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    resource = {
        "current_host": "algo-1",
        "hosts": ["algo-1"],
        "current_instance_type": "ml.p4d.24xlarge",
        "network_interface_name": "eth0",
    }
    (config / "resourceconfig.json").write_text(json.dumps(resource))
    (config / "hyperparameters.json").write_text("{}")
    (config / "inputdataconfig.json").write_text("{}")
    process_environ = {"PATH": os.environ.get("PATH", ""), "NCCL_PROTO": "LL128"}
    monkeypatch.setattr(os, "environ", dict(process_environ))
    seen = []

    def run_elastic(plan, config, *, run_id, environ):  # what the workers will run with
        seen.append((plan.mode, dict(environ)))
        return 0

    monkeypatch.setattr(launch, "run_elastic", run_elastic)
    caplog.set_level("INFO", logger="yolov5_smddp.sagemaker")
    environ = {"SAGEMAKER_BASE_DIR": str(tmp_path), "SM_NUM_GPUS": "0", **process_environ}
    assert main(["--nproc-per-node", "2", "--epochs", "1"], environ=environ) == 0
    assert [mode for mode, _ in seen] == ["elastic"]
    inherited = seen[0][1]
    assert {k: inherited[k] for k in inherited if k not in ("PATH", "SAGEMAKER_BASE_DIR", "SM_NUM_GPUS")} == {
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "FI_PROVIDER": "efa",
        "NCCL_PROTO": "LL128",  # the user's
        "NCCL_SOCKET_IFNAME": "eth0",
    }
    assert (
        os.environ == process_environ
    )  # the driver builds the workers' environment; it never writes its own
    expected = (
        "network (ml.p4d.24xlarge): FI_EFA_USE_DEVICE_RDMA=1 FI_PROVIDER=efa NCCL_SOCKET_IFNAME=eth0; "
        "already set NCCL_PROTO=LL128"
    )
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("network (")] == [expected]
