"""One training run: the trainer's loop, the engine's step, run state, optimiser recipe, data wiring,
checkpoints and resumption, EMA, the time budget, the stop signal and the per-epoch reports."""
