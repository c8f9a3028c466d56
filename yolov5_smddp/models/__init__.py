"""The YOLOv5 model family: blocks, the Detect head, the config builder and checkpoint I/O."""
