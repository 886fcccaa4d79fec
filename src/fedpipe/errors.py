"""Errors every layer may raise and the stage entry point turns into one line and an exit code.
:class:`ConfigError` is also importable from :mod:`fedpipe.config` and :mod:`fedpipe.config.core`."""

from typing import Any


class ConfigError(ValueError):
    """An invalid parameter: ``key`` (dotted path), the ``value`` given, and what is ``allowed``;
    exit code 2, raised before any compute."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"invalid config: {key}={value!r}; allowed: {allowed}")


class CompositionError(ConfigError):
    """``params.yaml`` cannot be composed from ``conf/`` with the overrides given (an unknown key, a
    group option with no file, an override Hydra cannot parse): the one line, ready-made by
    :mod:`fedpipe.pipeline.compose` from Hydra's error or fedpipe's override check; exit code 2."""

    def __init__(self, line: str, key: str = "", value: Any = None, allowed: str = ""):
        self.key, self.value, self.allowed = key, value, allowed
        ValueError.__init__(self, line)

    def __reduce__(self):
        return (type(self), (str(self), self.key, self.value, self.allowed))


class DivergenceError(RuntimeError):
    """A non-finite loss or update (the message names the round and client); exit code 3."""


class SkippedStageError(RuntimeError):
    """An input is the placeholder of a stage the study's plan skipped (or the plan is missing); the
    message names the file and what builds it; exit code 2."""


class InputError(RuntimeError):
    """A missing or unreadable input file of a stage: names the file, what is wrong with it, and
    the ``dvc repro <stage>`` that rebuilds it (when known: a resume file has no stage of its own);
    exit code 2, raised before the file is used."""

    def __init__(self, path: object, problem: str, stage: str | None):
        self.path, self.problem, self.stage = str(path), problem, stage
        how = f"; run `dvc repro {stage}` to rebuild it" if stage else ""
        super().__init__(f"input {self.path}: {problem}{how}")

    def __reduce__(self):  # raised in a worker process, it crosses back whole
        return (type(self), (self.path, self.problem, self.stage))
