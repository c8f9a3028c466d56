"""One module per `yolov5-smddp` sub-command: `add_arguments(parser)` and `run(args) -> int`."""
