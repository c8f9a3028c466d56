# Test layer on the project image: the test tools (the same as docker/dev.Dockerfile). The source is
# mounted at /src; `./build.sh test` runs ruff and the unit/integration tests in it.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
# One RUN (every Dockerfile step costs ~20 s on some engines, see ../Dockerfile):
# - mlflow-skinny (tests/unit/test_mlflow_log.py reads runs back from a real file store) needs newer
#   typing_extensions and certifi than Debian's, which pip cannot uninstall: those go beside them in /usr/local;
# - export / serving / plots tests: ONNX export and onnxruntime, OpenVINO (export --include openvino and
#   predict on its IR; 2026.4.1 has cp311 and cp313 wheels) and onnxslim (export --simplify), pinned;
#   matplotlib comes with the base (the DLC through fastai, the stand-in as python3-matplotlib) and is
#   installed, pinned, only where it is missing;
# - tests/unit/test_serving.py runs code/inference.py under the SageMaker PyTorch serving stack's Python side
#   (TorchServe's backend and the two inference toolkits, pinned, --no-deps); their dependencies come with
#   the base.
RUN set -e; \
    pip_install() { PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir -q --root-user-action=ignore "$@"; }; \
    pip_install "pytest>=7" "ruff==0.17.6" "pycocotools>=2.0.7"; \
    pip_install --ignore-installed "typing_extensions>=4.14" "certifi>=2025.8"; \
    pip_install "mlflow-skinny==3.18.*"; \
    pip_install "onnx==1.18.0" "onnxscript==0.7.2" "onnxruntime==1.22.0" "openvino==2026.4.1" "onnxslim==0.1.98"; \
    python3 -c "import matplotlib" 2>/dev/null || pip_install "matplotlib==3.10.0"; \
    pip_install --no-deps "torchserve==0.12.0" "sagemaker-inference==1.10.1" "sagemaker-pytorch-inference==2.0.25"
ENV PYTHONPATH=/src USE_LIBUV=0
WORKDIR /src
ENTRYPOINT []
CMD ["/bin/bash"]
