"""Research tools, run from a checkout (not installed with the package): `python -m bench.scaling` (the
multi-node scaling model) and `python -m bench.overlap` (that model's overlap assumption against real DDP
processes). The benchmarks a user runs on an instance are `yolov5-smddp bench train|data|workers`."""
