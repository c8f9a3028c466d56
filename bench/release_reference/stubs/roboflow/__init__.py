"""Stand-in for the `roboflow` package, which the release's train.py imports but the benchmark never uses
(its datasets are local files); any use fails loudly."""


class Roboflow:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("the convergence benchmark's roboflow stand-in cannot download datasets")
