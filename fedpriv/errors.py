"""The base class of fedpriv's user-facing errors (bad input, refused privacy, unusable checkpoints)."""


class FedprivError(Exception):
    """Base class of the errors fedpriv raises for bad *input* (a user error, not a bug): data
    files, tokenizer files, configs, parameters. Its message is one line naming the problem.
    Experiment entry points (``experiments.common.cli``) print it on stderr and exit 2."""
