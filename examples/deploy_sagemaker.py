"""Deploy a trained yolov5-smddp model (the training job's model.tar.gz: best.pt2 or best.torchscript +
code/inference.py) to a SageMaker real-time endpoint served by our own image (`serve`), with the Python SDK
(v2 `sagemaker.model.Model`, or v3 `ModelBuilder`). All arguments come from `yolov5_smddp.client.deploy`,
which is tested without AWS; this script only turns them into SDK objects.

    pip install "sagemaker>=2.200,<3"            # or sagemaker>=3 for --sdk v3
    python examples/deploy_sagemaker.py \
        --model-data s3://my-bucket/yolov5-smddp-2026-01-01-00-00-00-000/output/model.tar.gz \
        --role arn:aws:iam::111111111111:role/SageMakerRole --instance-type ml.g5.xlarge \
        --image-uri 111111111111.dkr.ecr.us-west-2.amazonaws.com/yolov5-smddp:latest \
        --env YOLOV5_CONF=0.3 --image dog.jpg

`--dry-run` prints the arguments instead of creating anything (no SDK or credentials needed). With
`--image`, the endpoint is called once with that JPEG and the JSON answer printed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from yolov5_smddp.client.deploy import (
    DeploySpec,
    deploy_kwargs,
    model_builder_deploy_kwargs,
    model_builder_kwargs,
    model_kwargs,
)
from yolov5_smddp.errors import ConfigError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-data", required=True, help="S3 URI of the training job's model.tar.gz")
    p.add_argument("--role", required=True, help="IAM role ARN for the endpoint")
    p.add_argument(
        "--image-uri", required=True, help="the ECR image the model was trained with (it serves the model)"
    )
    p.add_argument("--sdk", choices=("v2", "v3"), default="v2")
    p.add_argument("--instance-type", default="ml.g5.xlarge")
    p.add_argument("--instance-count", type=int, default=1)
    p.add_argument("--endpoint-name")
    p.add_argument("--region", help="the endpoint's region (default: the image's)")
    p.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="YOLOV5_CONF, YOLOV5_IOU, ..."
    )
    p.add_argument("--image", type=Path, help="a JPEG to send once the endpoint is up")
    p.add_argument("--dry-run", action="store_true", help="print the SDK arguments and stop")
    return p.parse_args(argv)


def spec_from_args(args: argparse.Namespace) -> DeploySpec:
    thresholds = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--env {item!r}: expected KEY=VALUE")
        thresholds[key] = value
    return DeploySpec(
        model_data=args.model_data,
        role=args.role,
        image_uri=args.image_uri,
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        endpoint_name=args.endpoint_name,
        region=args.region,
        thresholds=thresholds,
    )


def deploy_v2(spec: DeploySpec, image: Path | None, dry_run: bool) -> None:
    model, deploy = model_kwargs(spec), deploy_kwargs(spec)
    if dry_run:
        print(json.dumps({"Model": model, "deploy": deploy}, indent=2))
        return
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.model import Model
    from sagemaker.predictor import Predictor
    from sagemaker.serializers import IdentitySerializer

    model["predictor_cls"] = Predictor
    deploy.update(serializer=IdentitySerializer(content_type="image/jpeg"), deserializer=JSONDeserializer())
    predictor = Model(**model).deploy(**deploy)
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
    # model.tar.gz already holds code/inference.py (the handler it was trained with): nothing to repack
    (deploy_v2 if args.sdk == "v2" else deploy_v3)(spec_from_args(args), args.image, args.dry_run)


if __name__ == "__main__":
    try:
        main()
    except ConfigError as exc:  # a spec problem: the message says which value and why
        raise SystemExit(f"error: {exc}") from None
