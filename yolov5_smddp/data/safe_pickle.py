"""An allow-listed unpickler for INSPECTING foreign pickles (never for loading data we then trust).

Only numpy array reconstruction and plain containers can be built: any other global a pickle names
(os.system, builtins.eval, a class with a __reduce__ hook, ...) raises UnsafePickle before it is
imported or called, so a crafted file cannot run code. Plain containers (dict, list, tuple, str, bytes,
numbers) need no globals at all in the pickle protocol.
"""

from __future__ import annotations

import io
import pickle

import numpy as np

try:  # numpy >= 2 pickles reference numpy._core, older ones numpy.core; both map to the same objects
    from numpy._core import multiarray as _multiarray
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray as _multiarray

_ALLOWED = {
    (module, name): obj
    for module in ("numpy.core.multiarray", "numpy._core.multiarray")
    for name, obj in (("_reconstruct", _multiarray._reconstruct), ("scalar", _multiarray.scalar))
}
_ALLOWED.update({("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype})
_ALLOWED.update({("collections", "OrderedDict"): dict})


class UnsafePickle(Exception):
    """The pickle needs a global outside the allow-list (or is not a pickle); the message says which."""


class _AllowListUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickle(f"refers to {module}.{name}, which is not allowed") from None

    def persistent_load(self, pid):
        raise UnsafePickle("uses persistent ids, which are not allowed")


def inspect_pickle(data: bytes) -> object:
    """Unpickle `data` allowing only numpy arrays/scalars/dtypes and plain containers.

    Raises UnsafePickle for anything else, including malformed data.
    """
    try:
        return _AllowListUnpickler(io.BytesIO(data)).load()  # noqa: S301 - allow-listed find_class
    except UnsafePickle:
        raise
    except Exception as exc:  # malformed pickles raise many types; all mean "cannot inspect"
        raise UnsafePickle(f"is not a readable pickle ({type(exc).__name__}: {exc})") from None
