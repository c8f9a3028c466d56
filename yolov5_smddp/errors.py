"""Exceptions for bad input. Their messages are written for the user: they name the file or value and
say why it is wrong and what to do. The CLI and the SageMaker boundary print them without a traceback
(the traceback still goes to the log at debug level) and turn them into a non-zero exit."""

EXIT_INTERRUPTED = 143
"""128 + SIGTERM: the run wrote its checkpoint and stopped; the same command resumes it. The trainer
returns it; the elastic launcher and the SageMaker driver pass it on."""


class UserError(Exception):
    """Bad input from the user (a file, a value, a dataset, a checkpoint)."""


class ConfigError(UserError):
    """An invalid option, hyperparameter or YAML value. The message names the key."""


class DataError(UserError):
    """A dataset problem that makes training impossible (no usable labels, bad data.yaml, strict cache)."""


class WeightsError(UserError):
    """A checkpoint that cannot be read safely or does not fit the model."""
