"""Distributed training: the launcher's environment, backend choice (smddp / nccl / gloo), the
process group and its collectives, validation shards."""
