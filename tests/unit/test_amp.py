"""engine.resolve_amp: the precision by the GPU's compute capability (faked here), and why."""

import pytest

from yolov5_smddp.errors import ConfigError
from yolov5_smddp.train.engine import AmpPolicy, resolve_amp

V100, T4, A100, A10G, H100 = (7, 0), (7, 5), (8, 0), (8, 6), (9, 0)


@pytest.mark.parametrize(
    "requested, device_type, capability, mode, reason",
    [
        ("auto", "cuda", V100, "fp16", "auto: compute capability 7.0 < 8.0"),
        ("auto", "cuda", T4, "fp16", "auto: compute capability 7.5 < 8.0"),
        ("auto", "cuda", A100, "bf16", "auto: compute capability 8.0 >= 8.0"),
        ("auto", "cuda", A10G, "bf16", "auto: compute capability 8.6 >= 8.0"),
        ("auto", "cuda", H100, "bf16", "auto: compute capability 9.0 >= 8.0"),
        ("auto", "cpu", None, "off", "auto: no CUDA device"),
        ("fp16", "cuda", H100, "fp16", "--amp fp16"),
        ("fp16", "cuda", V100, "fp16", "--amp fp16"),
        ("bf16", "cuda", A100, "bf16", "--amp bf16"),
        ("bf16", "cpu", None, "bf16", "--amp bf16"),
        ("off", "cuda", V100, "off", "--amp off"),
        ("off", "cpu", None, "off", "--amp off"),
    ],
)
def test_amp_by_capability(requested, device_type, capability, mode, reason):
    policy = resolve_amp(requested, device_type, capability)
    assert (policy.mode, policy.device_type, policy.reason) == (mode, device_type, reason)
    assert policy == AmpPolicy(mode, device_type)  # the reason is not part of the policy's identity


def test_impossible_modes_are_one_clear_error():
    with pytest.raises(ConfigError, match="--amp fp16 needs a CUDA device"):
        resolve_amp("fp16", "cpu", None)
    with pytest.raises(
        ConfigError, match=r"--amp bf16: this GPU \(compute capability 7.5\) has no fast bfloat16"
    ):
        resolve_amp("bf16", "cuda", T4)
