"""What `--compile` changes around the step besides torch.compile itself (issue 52, item 2). Pure.

- CUDA graphs (mode reduce-overhead) with gradient accumulation: after `zero_grad(set_to_none=True)` the
  first backward of the next step takes a buffer owned by the recorded graph as `.grad`, and the next
  replay overwrites it (pytorch issues 96693 and 169545: 0.25 instead of 1.0 after 4 accumulated
  micro-steps). So the gradients are allocated once, before the first compiled micro-step, and zeroed in
  place (`set_to_none=False`): every backward then accumulates into memory the graphs do not own. Each
  micro-step also marks a new CUDA-graph step (`torch.compiler.cudagraph_mark_step_begin`), so the outputs
  of the previous replay are not taken for live ones.
- Fixed batch shape (no --rect, no --multi-scale): the last, partial batch of an epoch would be a new shape
  and a new compile (minutes for yolov5x) at the end of every epoch's first pass; the training loader drops
  it instead (drop_last), so a run compiles once. Each epoch's sampler order changes, so a dropped image is
  seen in other epochs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CompileSettings:
    compiled: bool
    cudagraphs: bool
    """mode reduce-overhead: the step replayed as CUDA graphs."""
    keep_grads: bool
    """gradients allocated before the first micro-step and zeroed in place (never set to None)."""
    mark_steps: bool
    """torch.compiler.cudagraph_mark_step_begin() before each micro-step."""
    drop_last: bool
    """the training loader drops the epoch's partial last batch (one batch shape, one compile)."""
    reason: str
    """one log line."""


def compile_settings(
    *, compile: bool, mode: str, rect: bool, multi_scale: bool, accumulate: int
) -> CompileSettings:
    """The settings for a run: `mode` is torch.compile's (engine.compile_plan), `accumulate` the micro-steps
    per optimizer step at the start of the run (warm-up may use fewer)."""
    if not compile:
        return CompileSettings(False, False, False, False, False, "")
    cudagraphs = mode == "reduce-overhead"
    fixed = fixed_shape_compile(compile, rect, multi_scale)
    parts = []
    if cudagraphs:
        parts.append(
            "gradients kept allocated across micro-steps and zeroed in place (CUDA graphs"
            + (f", {accumulate} micro-steps per optimizer step)" if accumulate > 1 else ")")
        )
    if fixed:
        parts.append("the training loader drops each epoch's partial last batch (one shape, one compile)")
    return CompileSettings(
        compiled=True,
        cudagraphs=cudagraphs,
        keep_grads=cudagraphs,
        mark_steps=cudagraphs,
        drop_last=fixed,
        reason="; ".join(parts),
    )


def fixed_shape_compile(compile: bool, rect: bool, multi_scale: bool) -> bool:
    """--compile with one batch shape for the whole run: the training loader drops the partial last batch."""
    return bool(compile) and not rect and not multi_scale
