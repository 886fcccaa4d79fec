"""Checks of model options against the model's builder, before any data loads: the options of a
registered classifier (``model``, ``fid.classifier``) and of the UNet (``diffusion.unet_kwargs``)
are built once on torch's meta device (or, where a builder's construction runs a forward pass that
needs values, on the CPU), so that a value the builder refuses is one ConfigError line.

Kept apart from :mod:`fedpipe.config.fl` so that a stage that reads only the study (``report``)
does not import the model registry.
"""

from __future__ import annotations

from typing import Any

from fedpipe.config.core import ConfigError
from fedpipe.config.fl import ModelConfig

# Builder arguments that the pipeline sets from the dataset; params may not give them.
_SET_BY_PIPELINE = ("self", "in_shape", "num_classes", "mean", "std")


def check_model(cfg: ModelConfig, prefix: str = "model", in_shape: tuple[int, int, int] | None = None,
                num_classes: int | None = None) -> None:
    """``cfg.name`` is a registered model and ``cfg.kwargs`` are its options; with the data's
    ``in_shape`` and ``num_classes`` (known from the dataset config, nothing loaded) the model is
    also built once (meta device, else CPU; no data), so that a value its builder
    refuses (a negative or zero width, a string, an unknown norm) is one line before any data
    loads."""
    import inspect

    from fedpipe.models import MODELS, build_model

    if cfg.name not in MODELS:
        raise ConfigError(f"{prefix}.name", cfg.name, "one of " + ", ".join(sorted(MODELS)))
    options = set(inspect.signature(MODELS[cfg.name]).parameters) - set(_SET_BY_PIPELINE)
    for key in cfg.kwargs:
        if key not in options:
            raise ConfigError(f"{prefix}.kwargs.{key}", cfg.kwargs[key],
                              f"options of model {cfg.name}: {', '.join(sorted(options))}")
    if in_shape is not None and num_classes is not None:
        # classifiers are built on the CPU: small enough, and a forward pass on the meta device
        # (some builders run one to size their head) imports torch._dynamo, 0.8 s of every stage
        dry_build(f"{prefix}.kwargs", cfg.kwargs, f"model {cfg.name} for {in_shape} images",
                  lambda kw: build_model(cfg.name, in_shape, num_classes, **kw), meta=False)


def dry_build(key: str, kwargs: dict, what: str, builder: Any, meta: bool = True) -> None:
    """Build ``builder(kwargs)`` on the meta device (``meta=False``: on the CPU); a refusal, or a
    layer of size zero, is a ConfigError naming the option at fault when one option alone is (else
    all of ``kwargs``)."""
    problem = _build_problem(builder, kwargs, meta)
    if problem is None:
        return
    culprits = [k for k in kwargs if _build_problem(builder, {k: kwargs[k]}, meta) is not None]
    if len(culprits) == 1:
        k = culprits[0]
        raise ConfigError(f"{key}.{k}", kwargs[k], f"a value that builds {what} ({problem})")
    raise ConfigError(key, kwargs, f"options that build {what} ({problem})")


def _build_problem(builder: Any, kwargs: dict, meta: bool = True) -> str | None:
    """Why ``builder(kwargs)`` fails (None if it builds). Built on the meta device (no memory) and,
    for a builder whose construction itself runs a forward pass that needs values, on the CPU;
    either way inside ``fork_rng``, so that the global RNG is left as it was."""
    import warnings

    import torch

    def attempt(device: str):
        with torch.random.fork_rng(devices=[]), torch.device(device), torch.no_grad(), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return builder(dict(kwargs))

    try:
        try:
            model = attempt("meta" if meta else "cpu")
        except (RuntimeError, NotImplementedError) as e:
            if not meta or "meta" not in str(e):
                raise
            model = attempt("cpu")
    except Exception as e:  # noqa: BLE001 (whatever the builder refuses is the user's value)
        lines = str(e).strip().splitlines() or [type(e).__name__]
        return f"{type(e).__name__}: {lines[0][:200]}"
    empty = [n for n, p in model.named_parameters() if p.numel() == 0]
    if empty:
        return f"layer {empty[0]} would have size zero"
    return None
