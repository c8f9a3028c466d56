"""Stand-in (see the package docstring)."""


class Version:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("the convergence benchmark's roboflow stand-in cannot download datasets")
