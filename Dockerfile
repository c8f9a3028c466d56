# yolov5-smddp training image: an AWS PyTorch training DLC (the SageMaker toolkit, torch, torchvision,
# OpenCV) plus this package. Two DLC flavours (`./build.sh build --dlc current|smddp`): current (the default,
# the newest DLC AWS still patches: NCCL) or smddp (the 2.5.1 DLC, the last with SMDDP). Only our package is
# installed (--no-deps): never a second torch or OpenCV over the base image's. Any image with python3, torch,
# torchvision, cv2 and yaml works as a base (then NCCL/Gloo), e.g. the local stand-ins (`--base local`).
ARG REGION=us-west-2
# The DLCs: yolov5_smddp/dlc.py owns these values (a test checks they agree; build.sh reads them here).
ARG DLC_ACCOUNT=763104351884
ARG CURRENT_DLC_TAG=2.10.0-gpu-py313-cu130-ubuntu22.04-sagemaker
ARG SMDDP_DLC_TAG=2.5.1-gpu-py311-cu124-ubuntu22.04-sagemaker
ARG DLC_TAG=${CURRENT_DLC_TAG}
ARG BASE_IMAGE=${DLC_ACCOUNT}.dkr.ecr.${REGION}.amazonaws.com/pytorch-training:${DLC_TAG}
FROM ${BASE_IMAGE}

# Every instruction below is a build step that costs ~20 s on some Docker engines (the legacy builder on
# fuse-overlayfs, measured: a no-op ENV or ARG included), so they are few: one ENV, one RUN for what the base
# lacks, the source, one RUN to install it, then the labels.
#
# SAGEMAKER_PROGRAM is looked up in /opt/ml/code; the ENTRYPOINT is a thin layer in front of the base image's
# own (docker/entry.py: a local config for plain `docker run IMAGE train`, signal forwarding) that leaves the
# toolkit path as it is. MPLCONFIGDIR: matplotlib's font cache (the plots), built once below instead of at the
# start of every job (seconds, and "generated new fontManager"), whatever HOME a job runs with.
ENV SAGEMAKER_PROGRAM=entrypoint.py PATH=/opt/ml/code:${PATH} PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/opt/yolov5-smddp/matplotlib
ENTRYPOINT ["python3", "/usr/local/bin/yolov5-smddp-entry"]
CMD ["train"]

# What the base lacks, in one cached step:
# - the base must already carry everything we import: fail the build here, not in a training job;
# - best.onnx beside the first export in the model folder (yolov5_smddp.serving writes it when onnx imports):
#   the onnx package unless the base carries one, and onnxscript for torch >= 2.10's ONNX exporter (0.7.2 has
#   torch 2.10's and 2.11+'s APIs; 0.5.6 lacks the latter);
# - --tensorboard-dir (a JobSpec's tensorboard_s3_uri points it at /opt/ml/output/tensorboard, which SageMaker
#   uploads): torch's SummaryWriter needs the tensorboard package, which the DLC lacks. Pinned: a version whose
#   protobuf range the DLC's protobuf satisfies;
# - matplotlib's font cache (MPLCONFIGDIR above);
# - the loader's native loops (yolov5_smddp/data/native.py: JPEG region decoding, the HSV table fused with the
#   flips) are a small C library with a static libjpeg-turbo of its own (one libc and no foreign libjpeg in
#   the process), which setup.py builds into the package during the install below from libjpeg-turbo's pinned
#   source tarball (upstream's, or the apt mirrors' identical copy): here only the compiler, make, cmake and
#   nasm. A missing tool or a failed build fails that install, and a library that does not load fails the
#   check after it, so CI never tests an image without it.
RUN set -e; \
    python3 -c "import torch, torchvision, cv2, yaml, numpy; \
print('base image: torch', torch.__version__, 'torchvision', torchvision.__version__, 'cv2', cv2.__version__, \
'yaml', yaml.__version__, 'numpy', numpy.__version__)"; \
    pip_install() { PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --disable-pip-version-check \
        --root-user-action=ignore "$@"; }; \
    python3 -c "import onnx" 2>/dev/null || pip_install "onnx==1.18.0"; \
    if python3 -c "import torch, sys; sys.exit(tuple(map(int, torch.__version__.split('.')[:2])) < (2, 10))"; then \
        pip_install "onnxscript==0.7.2"; fi; \
    python3 -c "import tensorboard" 2>/dev/null || pip_install "tensorboard==2.18.0"; \
    mkdir -p "$MPLCONFIGDIR"; \
    python3 -c "import matplotlib.font_manager" || echo "matplotlib is not installed: plots will be skipped"; \
    (apt-get update -qq || echo "apt-get update reported errors (a third-party list?): installing from the rest"); \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev make cmake nasm; \
    rm -rf /var/lib/apt/lists/*

# Dependency metadata and the entry scripts before the package source: a code edit rebuilds only the layers
# below (one copy + one install).
COPY pyproject.toml setup.py LICENSE README.md entrypoint.py docker/entry.py /opt/yolov5-smddp/
COPY yolov5_smddp /opt/yolov5-smddp/yolov5_smddp
RUN cd /opt/yolov5-smddp \
    && PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-deps --no-build-isolation --no-cache-dir \
        --disable-pip-version-check --root-user-action=ignore . \
    && rm -rf build yolov5_smddp.egg-info \
    && install -D -m 0644 entrypoint.py /opt/ml/code/entrypoint.py \
    && install -m 0755 entry.py /usr/local/bin/yolov5-smddp-entry \
    && cd / && python3 -c "import yolov5_smddp.sagemaker, yolov5_smddp.launch; print('yolov5_smddp', yolov5_smddp.__version__)" \
    && python3 -c "from yolov5_smddp.data import native; lib = native.library(); \
assert lib is not None, native.why_not(); print('native library', native.library_path())" \
    && yolov5-smddp --help >/dev/null

# Labels last: a new revision changes only this metadata. DLC: which DLC flavour the base is (or stands in
# for), current or smddp (build.sh's --dlc).
ARG BASE_IMAGE DLC=current VERSION=0.0.0 GIT_REVISION=unknown
LABEL org.opencontainers.image.title="yolov5-smddp" \
      org.opencontainers.image.description="YOLOv5 training for Amazon SageMaker (SMDDP / NCCL / Gloo)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${GIT_REVISION}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      io.github.yolov5-smddp.dlc="${DLC}"
