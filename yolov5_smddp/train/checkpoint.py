"""Training checkpoints (`last.pt`, `best.pt`): atomic writes, safe loads, RNG state capture.

A checkpoint is a dict of tensors and plain containers only, so it loads with
`torch.load(weights_only=True)`: model and EMA state dicts, optimizer and scaler state, schedule position,
epoch, best fitness, RNG states (as tensors) and the resolved config. Files are written to a temporary
name in the same folder and renamed over the old one, so a reader never sees half a file.
"""

from __future__ import annotations

import pickle
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from yolov5_smddp.errors import WeightsError
from yolov5_smddp.files.atomic import atomic_write
from yolov5_smddp.models.torchfile import check_torch_file, torch_error_line
from yolov5_smddp.models.weights import TRAINING_CHECKPOINT_FORMAT

FORMAT = TRAINING_CHECKPOINT_FORMAT
LAST = "last.pt"
BEST = "best.pt"


@dataclass
class RunState:
    """Where a run stands: what a resume needs beyond the model, EMA, optimizer and scaler states. Adding
    a resume field is one field here (with its default for older checkpoints) and one line in each method."""

    epoch: int = 0
    """the next epoch to run (0-based)."""
    iteration: int = 0
    """micro-steps done so far."""
    best_fitness: float = -1.0
    stale_epochs: int = 0
    """epochs since the fitness last improved (early stopping)."""
    history: list[dict[str, float]] = field(default_factory=list)
    """one results row per finished epoch."""
    last_optimizer_iteration: int = -1
    """the micro-step of the last optimizer step (not saved: a resume starts at an optimizer step)."""
    time_used: float = 0.0
    """--time: seconds of the budget used by the epochs so far (budget.py)."""
    planned_epochs: int | None = None
    """--time: the run's epochs in all as last planned; None without --time."""

    def to_checkpoint(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "iteration": self.iteration,
            "best_fitness": self.best_fitness,
            "stale_epochs": self.stale_epochs,
            "history": self.history,
            "time_used": self.time_used,
            "planned_epochs": self.planned_epochs,
        }

    @classmethod
    def from_checkpoint(cls, state: dict[str, Any]) -> RunState:
        iteration = int(state["iteration"])
        return cls(
            epoch=int(state["epoch"]),
            iteration=iteration,
            best_fitness=float(state["best_fitness"]),
            stale_epochs=int(state["stale_epochs"]),
            history=list(state["history"]),
            last_optimizer_iteration=iteration - 1,
            time_used=float(state.get("time_used", 0.0)),
            planned_epochs=state.get("planned_epochs"),
        )


def atomic_torch_save(obj: Any, path: Path) -> None:
    """torch.save to a temporary file (next to `path`, or in its claimed folder's staging folder), fsync,
    then os.replace onto `path`."""
    with atomic_write(path) as handle:
        torch.save(obj, handle)


def save_checkpoint(folder: Path, state: dict[str, Any], *, best: bool = False) -> Path:
    """Write `state` as `last.pt` (and `best.pt` too when `best`); returns the last path."""
    state = {"format": FORMAT, **state}
    last = Path(folder) / LAST
    atomic_torch_save(state, last)
    if best:
        atomic_torch_save(state, Path(folder) / BEST)
    return last


def interrupted_message(when: str, folder: Path) -> str:
    """What a run stopped by SIGTERM prints: `when` is "in epoch 3" or "after epoch 2"."""
    return (
        f"interrupted {when}: checkpoint {folder / LAST} written; resume with --resume {folder / LAST} "
        f"(a job given --checkpoint-dir {folder} resumes it by itself)"
    )


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read one of our checkpoints (weights_only: no code runs). WeightsError when it is not one."""
    weights_hint = (
        f"weights (a model folder's best.pt, the release's .pt) start a new run with --weights {path}"
    )
    try:
        check_torch_file(path)  # declared sizes bounded before torch allocates
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:  # objects that are not plain data: never ours, never unpickled
        raise WeightsError(
            f"checkpoint {path} is not a yolov5-smddp training checkpoint: it holds pickled objects "
            f"({torch_error_line(exc)}); {weights_hint}"
        ) from exc
    except Exception as exc:  # truncated, not a torch file, declared sizes over the bound
        raise WeightsError(
            f"checkpoint {path} cannot be read safely ({torch_error_line(exc)}); a damaged last.pt: delete it "
            "to start afresh"
        ) from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise WeightsError(
            f"checkpoint {path} is not a yolov5-smddp training checkpoint (format {FORMAT}); {weights_hint}"
        )
    return state


def find_resumable(folder: Path) -> Path | None:
    """The `last.pt` in `folder` if there is one (stray temporary files from a kill are ignored)."""
    candidate = Path(folder) / LAST
    return candidate if candidate.is_file() else None


EPOCH_FILE = re.compile(r"^epoch(\d+)\.pt$")
"""--save-period's copies of last.pt: epochN.pt."""


def _has_run_state(state: dict[str, Any]) -> bool:
    return all(key in state for key in ("epoch", "iteration", "model", "ema", "optimizer", "scaler"))


def load_resumable(folder: Path) -> tuple[Path | None, dict[str, Any] | None, list[str]]:
    """The newest checkpoint in `folder` that loads: last.pt, else the newest of the epochN.pt copies and
    best.pt (when it carries run state) that loads; (path, its contents, what was skipped and why).
    (None, None, []) without a last.pt; the last.pt's WeightsError when nothing loads."""
    folder = Path(folder)
    last = find_resumable(folder)
    if last is None:
        return None, None, []
    try:
        return last, load_checkpoint(last), []
    except WeightsError as exc:
        first_error, skipped = exc, [f"{LAST} ({_reason(exc)})"]
    copies = sorted(
        (int(m.group(1)), p) for p in folder.iterdir() if (m := EPOCH_FILE.match(p.name)) and p.is_file()
    )
    found: tuple[Path, dict[str, Any]] | None = None
    for _, path in reversed(copies):
        try:
            found = path, load_checkpoint(path)
            break
        except WeightsError as exc:
            skipped.append(f"{path.name} ({_reason(exc)})")
    best = folder / BEST
    if best.is_file():
        try:
            state = load_checkpoint(best)
        except WeightsError as exc:
            skipped.append(f"{BEST} ({_reason(exc)})")
        else:
            if not _has_run_state(state):
                skipped.append(f"{BEST} (no run state)")
            elif found is None or int(state["epoch"]) > int(found[1]["epoch"]):
                if found is not None:
                    skipped.append(f"{found[0].name} (older than {BEST})")
                found = best, state
    if found is None:
        raise first_error
    return found[0], found[1], skipped


def _reason(exc: WeightsError) -> str:
    """The cause inside a load_checkpoint message: its parenthesised part, else the message."""
    text = str(exc)
    match = re.search(r"\((.*)\)", text)
    return match.group(1) if match else text


def capture_rng_state() -> dict[str, Any]:
    """torch (CPU and CUDA), numpy and Python RNG states as tensors and plain values."""
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(np_kind),
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "python": {
            "version": int(py_version),
            "internal": torch.tensor(py_internal, dtype=torch.int64),
            "gauss": py_gauss,
        },
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of capture_rng_state (CUDA states only when the device count matches)."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["internal"].tolist()), p["gauss"]))
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
