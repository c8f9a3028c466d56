"""The detection maths: box formats, the YOLOv5 loss, postprocessing (NMS) and COCO-style metrics."""
