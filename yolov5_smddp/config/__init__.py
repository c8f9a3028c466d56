"""The training configuration: `TrainConfig` and its command-line form, the typed `Hyp`, the batch
plan, the resume rules and the output folders."""
