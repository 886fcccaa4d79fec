"""Errors every layer may raise and the stage entry point turns into one line and an exit code
(beside :class:`fedpipe.config.ConfigError`, which names a params key)."""


class DivergenceError(RuntimeError):
    """A non-finite loss or update (the message names the round and client); exit code 3."""


class SkippedStageError(RuntimeError):
    """An input is the placeholder of a stage the study's plan skipped (or the plan is missing); the
    message names the file and what builds it; exit code 2."""
