"""fedpipe's one line for a mistyped ``-S key=value`` override, before DVC composes params.yaml.

DVC loads the Hydra plugins of ``hydra_plugins/`` in the repository root (its ``hydra.plugins_path``
default) before ``dvc exp run -S ...`` composes ``params.yaml`` from ``conf/``. Importing this module
wraps Hydra's step that applies ``key=value`` overrides: a key that the composed config does not have
(``fl.roudns=3``) stops the composition with fedpipe's line, naming the key, its value and the
closest known keys (``did you mean fl.rounds?``), instead of Hydra's advice to add it with ``+``
(which would put an unknown key in params.yaml and fail later, in the first stage that reads it).
Hydra has no public hook at that step, hence the wrapper; with another Hydra layout it does nothing.
``+key=value`` and ``~key`` keep their Hydra meaning.
"""

from __future__ import annotations

import difflib

from omegaconf import DictConfig, OmegaConf

try:
    from dvc.exceptions import InvalidArgumentError as _Base  # DVC prints "ERROR: <line>", exit 1
except ImportError:  # composed without DVC
    from hydra.errors import ConfigCompositionException as _Base


class UnknownKeyError(_Base):
    """A ``key=value`` override of a key the composed config does not have."""


def unknown_key_message(cfg: DictConfig, key: str, value: str) -> str | None:
    """fedpipe's line for ``key=value`` if ``key`` is not in ``cfg``, else None."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, throw_on_missing=False) if parent else cfg
    if isinstance(node, DictConfig) and leaf in node:
        return None
    # the deepest existing section on the way, and its keys
    parts = key.split(".")
    depth = 0
    node = cfg
    while depth < len(parts) - 1 and isinstance(node, DictConfig) and parts[depth] in node:
        node = node[parts[depth]]
        depth += 1
    if not isinstance(node, DictConfig):
        return None  # a key inside a list or a scalar: Hydra's own error
    prefix = ".".join(parts[:depth])
    names = [str(k) for k in node.keys()]
    close = difflib.get_close_matches(parts[depth], names, n=3, cutoff=0.6)
    where = f"a key of {prefix}" if prefix else "a top-level section"
    if close:
        hint = " (did you mean " + " or ".join(f"{prefix}.{c}" if prefix else c for c in close) + "?)"
    else:  # e.g. another partition scheme's key: pick the scheme first (-S partition=dirichlet)
        hint = ": " + ", ".join(sorted(names))
        if "scheme" in names:
            hint += f" (this scheme is {node['scheme']}; another scheme's keys come with it: "
            hint += f"-S {prefix}=<scheme>)"
    return f"invalid config: {key}={value}; allowed: {where}{hint}"


def _install() -> None:
    try:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
    except ImportError:
        return
    apply = getattr(ConfigLoaderImpl, "_apply_overrides_to_config", None)
    if apply is None or getattr(apply, "_fedpipe", False):
        return

    def checked(overrides, cfg):
        for o in overrides:
            if o.package is None and not (o.is_add() or o.is_force_add() or o.is_delete()):
                line = unknown_key_message(cfg, o.key_or_group, o.get_value_string())
                if line is not None:
                    raise UnknownKeyError(line)
        apply(overrides, cfg)

    checked._fedpipe = True
    ConfigLoaderImpl._apply_overrides_to_config = staticmethod(checked)


_install()
