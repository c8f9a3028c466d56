"""yolov5-smddp: YOLOv5 object detection training for Amazon SageMaker (SMDDP / NCCL / Gloo)."""

__version__ = "0.1.0"
