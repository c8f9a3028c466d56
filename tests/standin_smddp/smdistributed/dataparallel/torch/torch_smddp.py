"""Test stand-in for `smdistributed.dataparallel.torch.torch_smddp`.

Importing the real module registers the "smddp" process-group backend. This stand-in registers a
backend of the same name that delegates every collective to Gloo, so that
`torch.distributed.init_process_group("smddp")` and everything after it (DDP, all_reduce, broadcast,
barrier) runs for real in tests, on CPU. Put `tests/standin_smddp` on PYTHONPATH to use it.
"""

from __future__ import annotations

import torch.distributed as dist

# torch calls the creator once per device type listed in `devices`; both must share one Gloo group.
_groups: dict[int, object] = {}


def _create_gloo_backend(store, group_rank, group_size, timeout):
    """Creator with torch's plain (non-extended) signature: (store, rank, world_size, timedelta)."""
    key = id(store)
    if key not in _groups:
        _groups[key] = dist.ProcessGroupGloo(store, group_rank, group_size, timeout)
    return _groups[key]


if "smddp" not in dist.Backend.backend_list:
    dist.Backend.register_backend("smddp", _create_gloo_backend, devices=["cpu", "cuda"])
