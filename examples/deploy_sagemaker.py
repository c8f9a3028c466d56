"""Deploy a trained yolov5-smddp model (the training job's model.tar.gz: best.torchscript + code/inference.py)
to a SageMaker real-time endpoint with the Python SDK (v2 `PyTorchModel`, or v3 `ModelBuilder`). All arguments
come from `yolov5_smddp.client.deploy`, which is tested without AWS; this script only turns them into SDK objects.

    pip install "sagemaker>=2.200,<3"            # or sagemaker>=3 for --sdk v3
    python examples/deploy_sagemaker.py \
        --model-data s3://my-bucket/yolov5-smddp-2026-01-01-00-00-00-000/output/model.tar.gz \
        --role arn:aws:iam::111111111111:role/SageMakerRole --instance-type ml.g5.xlarge \
        --env YOLOV5_CONF=0.3 --image dog.jpg

`--dry-run` prints the arguments instead of creating anything (no SDK or credentials needed). With
`--image`, the endpoint is called once with that JPEG and the JSON answer printed.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from yolov5_smddp.client.deploy import (
    ENTRY_POINT,
    DeploySpec,
    deploy_kwargs,
    model_builder_deploy_kwargs,
    model_builder_kwargs,
    pytorch_model_kwargs,
)
from yolov5_smddp.errors import ConfigError
from yolov5_smddp.serving import handler_source


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-data", required=True, help="S3 URI of the training job's model.tar.gz")
    p.add_argument("--role", required=True, help="IAM role ARN for the endpoint")
    p.add_argument("--sdk", choices=("v2", "v3"), default="v2")
    p.add_argument("--instance-type", default="ml.g5.xlarge")
    p.add_argument("--instance-count", type=int, default=1)
    p.add_argument("--endpoint-name")
    p.add_argument("--region", default="us-west-2")
    p.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="YOLOV5_CONF, YOLOV5_IOU, ..."
    )
    p.add_argument("--image", type=Path, help="a JPEG to send once the endpoint is up")
    p.add_argument("--dry-run", action="store_true", help="print the SDK arguments and stop")
    return p.parse_args(argv)


def spec_from_args(args: argparse.Namespace, source_dir: str) -> DeploySpec:
    thresholds = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--env {item!r}: expected KEY=VALUE")
        thresholds[key] = value
    return DeploySpec(
        model_data=args.model_data,
        role=args.role,
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        endpoint_name=args.endpoint_name,
        region=args.region,
        source_dir=source_dir,
        thresholds=thresholds,
    )


def deploy_v2(spec: DeploySpec, image: Path | None, dry_run: bool) -> None:
    model_kwargs, deploy = pytorch_model_kwargs(spec), deploy_kwargs(spec)
    if dry_run:
        print(json.dumps({"PyTorchModel": model_kwargs, "deploy": deploy}, indent=2))
        return
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.pytorch import PyTorchModel
    from sagemaker.serializers import IdentitySerializer

    deploy.update(serializer=IdentitySerializer(content_type="image/jpeg"), deserializer=JSONDeserializer())
    predictor = PyTorchModel(**model_kwargs).deploy(**deploy)
    print("endpoint", predictor.endpoint_name)
    if image is not None:
        print(json.dumps(predictor.predict(image.read_bytes()), indent=1))


def deploy_v3(spec: DeploySpec, image: Path | None, dry_run: bool) -> None:
    builder_kwargs, deploy = model_builder_kwargs(spec), model_builder_deploy_kwargs(spec)
    if dry_run:
        print(json.dumps({"ModelBuilder": builder_kwargs, "deploy": deploy}, indent=2))
        return
    from sagemaker.serve import ModelBuilder

    builder = ModelBuilder(**builder_kwargs)
    builder.build()
    endpoint = builder.deploy(**deploy)
    print("endpoint", endpoint)
    if image is not None:
        print(endpoint.invoke(body=image.read_bytes(), content_type="image/jpeg"))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as code_dir:
        # SDK v2 repacks model.tar.gz with this folder as code/: the same handler training wrote there
        (Path(code_dir) / ENTRY_POINT).write_text(handler_source(), encoding="utf-8")
        spec = spec_from_args(args, code_dir if not args.dry_run else "code")
        (deploy_v2 if args.sdk == "v2" else deploy_v3)(spec, args.image, args.dry_run)


if __name__ == "__main__":
    try:
        main()
    except ConfigError as exc:  # a spec problem: the message says which value and why
        raise SystemExit(f"error: {exc}") from None
