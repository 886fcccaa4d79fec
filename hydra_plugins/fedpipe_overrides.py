"""fedpipe's one line for a mistyped ``-S key=value`` override, before DVC composes params.yaml.

DVC loads the Hydra plugins of ``hydra_plugins/`` in the repository root (its ``hydra.plugins_path``
default) before ``dvc exp run -S ...`` composes ``params.yaml`` from ``conf/``. Importing this module
wraps Hydra's step that applies ``key=value`` overrides: a key that the composed config does not have
(``fl.roudns=3``) stops the composition with fedpipe's line, naming the key, its value and the
closest known keys (``did you mean fl.rounds?``), instead of Hydra's advice to add it with ``+``
(which would put an unknown key in params.yaml and fail later, in the first stage that reads it).
Hydra has no public hook at that step, hence the wrapper; with another Hydra layout it does nothing.
``+key=value`` and ``~key`` keep their Hydra meaning.

The same step gives ``algorithms`` its shape (:func:`method_sections`): before the overrides, every
registered method has a section (``{}`` unless ``conf/`` sets something), so that
``-S algorithms.<name>.<key>=...`` reaches any method without ``+``; after them, only the sections of
the study's methods stay. A method's defaults live in its config dataclass alone, and
``params.yaml`` carries the study's methods, each with what the study changes (DVC's
``algorithms.<name>`` param of ``federate@<name>-<seed>`` needs the section to exist).
"""

from __future__ import annotations

import difflib
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

try:
    from dvc.exceptions import InvalidArgumentError as _Base  # DVC prints "ERROR: <line>", exit 1
except ImportError:  # composed without DVC
    from hydra.errors import ConfigCompositionException as _Base


class UnknownKeyError(_Base):
    """A ``key=value`` override of a key the composed config does not have."""


def section_fields(cfg: DictConfig, section: str) -> set[str]:
    """The settings the config dataclass of top-level ``section`` has, for the option its conf
    picked (``dataset.name``, ``partition.scheme``; ``fl``'s own), or an empty set."""
    try:
        import dataclasses

        from fedpipe.config import DATASET_CONFIGS, PARTITION_CONFIGS
        from fedpipe.config.fl import FLConfig
    except ImportError:  # composed without fedpipe installed
        return set()
    node = cfg.get(section)
    cls = {"dataset": lambda n: DATASET_CONFIGS.get(n.get("name")),
           "partition": lambda n: PARTITION_CONFIGS.get(n.get("scheme")),
           "fl": lambda n: FLConfig}.get(section, lambda n: None)(node) \
        if isinstance(node, DictConfig) else None
    return {f.name for f in dataclasses.fields(cls)} if cls else set()


def unknown_key_message(cfg: DictConfig, key: str, value: str) -> str | None:
    """fedpipe's line for ``key=value`` if ``key`` is not in ``cfg``, else None. A setting that the
    section's config has but its conf/ file does not write (``dataset.holdout_fraction`` on the
    digits) is told apart from a misspelling: it is added with ``+``."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, throw_on_missing=False) if parent else cfg
    if isinstance(node, DictConfig) and leaf in node:
        return None
    if "." not in parent and parent and leaf in section_fields(cfg, parent):
        return (f"invalid config: {key}={value}; {key} is a setting of {parent} that its conf/ "
                f"file does not write: add it with +{key}={value}")
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


def method_sections(cfg: DictConfig, names: list[str], keep_study: bool) -> None:
    """Add an empty ``algorithms.<name>`` section for each of ``names`` that has none; with
    ``keep_study``, drop every section but those of ``study.algorithms`` and
    ``study.diffusion_algorithms`` (a study that names an unknown method keeps its sections as they
    are: the plan's check names it)."""
    from omegaconf import open_dict

    with open_dict(cfg):
        if "algorithms" not in cfg or cfg.algorithms is None:
            cfg.algorithms = {}
        algos = cfg.algorithms
        if not isinstance(algos, DictConfig):
            return  # a malformed section: the plan's check names it
        with open_dict(algos):
            for name in names:
                if name not in algos:
                    algos[name] = {}
            study = cfg.get("study")
            if not keep_study or not isinstance(study, DictConfig):
                return
            used = [*(study.get("algorithms") or []), *(study.get("diffusion_algorithms") or [])]
            if not all(isinstance(u, str) for u in used):
                return
            for name in list(algos.keys()):
                if name not in used:
                    del algos[name]


def method_key_message(cfg: DictConfig, key: str, value: str, names: list[str]) -> str | None:
    """For ``algorithms.<method>.<field>=value``: make the field settable (its dataclass default put
    in the method's section, where the study's conf/ does not set it) and return None, or return
    fedpipe's line for a field the method's config does not have (a method not registered is left
    to :func:`unknown_key_message`)."""
    parts = key.split(".")
    if len(parts) < 3 or parts[0] != "algorithms" or parts[1] not in names:
        return None
    import dataclasses

    from fedpipe.algorithms import ALGORITHMS
    from fedpipe.config.fl import INIT_KEYS

    cls = ALGORITHMS[parts[1]]
    config = cls.config_class
    fields = {f.name: f for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) \
        else {}
    section = cfg.algorithms[parts[1]]
    field = parts[2]
    if field in section:
        return None
    if field in INIT_KEYS or field in fields:
        from omegaconf import open_dict

        default = (cls.default_backbone if field == "backbone" else None) if field in INIT_KEYS \
            else getattr(config(), field)
        with open_dict(section):
            section[field] = list(default) if isinstance(default, tuple) else default
        return None
    allowed = sorted([*fields, *INIT_KEYS])
    close = difflib.get_close_matches(field, allowed, n=3, cutoff=0.6)
    hint = (" (did you mean " + " or ".join(f"algorithms.{parts[1]}.{c}" for c in close) + "?)"
            if close else ": " + ", ".join(allowed))
    return f"invalid config: {key}={value}; allowed: a key of algorithms.{parts[1]}{hint}"


def _registered() -> list[str]:
    try:
        from fedpipe.algorithms.registry import scan
    except ImportError:  # composed without fedpipe installed: leave the sections as conf/ has them
        return []
    return list(scan())


ROOT = Path(__file__).resolve().parents[1]  # the repository whose conf/ DVC composes


def _workspace_busy() -> str | None:
    try:
        from fedpipe.pipeline.compose import workspace_busy
    except ImportError:  # composed without fedpipe installed
        return None
    return workspace_busy(ROOT)


def _composition_line(e: BaseException) -> str | None:
    try:
        from fedpipe.pipeline.compose import composition_error
    except ImportError:
        return None
    err = composition_error(e, ROOT / "conf")
    return None if err is None else str(err)


def _install() -> None:
    try:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
    except ImportError:
        return
    apply = getattr(ConfigLoaderImpl, "_apply_overrides_to_config", None)
    if apply is None or getattr(apply, "_fedpipe", False):
        return

    def checked(overrides, cfg):
        busy = _workspace_busy()
        if busy:  # a second `dvc exp run -S` in a busy workspace: refused before params.yaml changes
            raise UnknownKeyError(busy)
        names = _registered()
        method_sections(cfg, names, keep_study=False)
        for o in overrides:
            if o.package is None and not (o.is_add() or o.is_force_add() or o.is_delete()):
                line = method_key_message(cfg, o.key_or_group, o.get_value_string(), names) \
                    or unknown_key_message(cfg, o.key_or_group, o.get_value_string())
                if line is not None:
                    raise UnknownKeyError(line)
        apply(overrides, cfg)
        if names:
            method_sections(cfg, names, keep_study=True)

    checked._fedpipe = True
    ConfigLoaderImpl._apply_overrides_to_config = staticmethod(checked)

    load = ConfigLoaderImpl._load_configuration_impl

    def loaded(self, *args, **kwargs):
        """Hydra's composition, with a failure (a misspelt group option, ``study=clasification``)
        turned into fedpipe's one line (:func:`fedpipe.pipeline.compose.composition_error`)."""
        try:
            return load(self, *args, **kwargs)
        except UnknownKeyError:
            raise
        except Exception as e:  # noqa: BLE001 (only composition errors are turned into a line)
            line = _composition_line(e)
            if line is None:
                raise
            raise UnknownKeyError(line) from None

    ConfigLoaderImpl._load_configuration_impl = loaded


_install()
