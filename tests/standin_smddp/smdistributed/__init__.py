"""Test stand-in for SageMaker's closed-source SMDDP library (see dataparallel/torch/torch_smddp.py)."""
