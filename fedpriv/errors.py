"""The base class of fedpriv's user-facing errors (bad input, refused privacy, unusable checkpoints),
and :class:`ConfigError` (a leaf module: configs import it without loading the library)."""


class FedprivError(Exception):
    """Base class of the errors fedpriv raises for bad *input* (a user error, not a bug): data
    files, tokenizer files, configs, parameters. Its message is one line naming the problem.
    Experiment entry points (``experiments.common.cli``) print it on stderr and exit 2."""


class ConfigError(FedprivError, ValueError):
    """A config, a ``--config`` spec or a ``field=value`` override is invalid (wrong type, out of
    range, unknown field, fractions that do not sum to 1, ...), or names something no registry
    holds (``fedpriv.registry``)."""
