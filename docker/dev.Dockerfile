# Development/test layer on the stand-in base: the project's test tools. The source is mounted at /src.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
# mlflow-skinny: as in docker/test.Dockerfile (Debian's typing_extensions/certifi are too old and pip cannot
# uninstall them, so newer ones go beside them in /usr/local).
RUN python3 -m pip install --no-cache-dir -q "pytest>=7" "ruff==0.17.6" "pycocotools>=2.0.7" \
    && python3 -m pip install --no-cache-dir -q --ignore-installed "typing_extensions>=4.14" "certifi>=2025.8" \
    && python3 -m pip install --no-cache-dir -q "mlflow-skinny==3.18.*"
# export / serving / plots tests: ONNX export and onnxruntime, OpenVINO and onnxslim (pinned, as in
# docker/test.Dockerfile); matplotlib comes with the base (the
# stand-in's python3-matplotlib) and is installed, pinned, only where it is missing
RUN python3 -m pip install --no-cache-dir -q "onnx==1.18.0" "onnxruntime==1.22.0" "openvino==2026.4.1" \
        "onnxslim==0.1.98" \
    && (python3 -c "import matplotlib" 2>/dev/null || python3 -m pip install --no-cache-dir -q "matplotlib==3.10.0")
ENV PYTHONPATH=/src USE_LIBUV=0
WORKDIR /src
ENTRYPOINT []
CMD ["/bin/bash"]
