"""Which file set a config key, and how the files add up: config/config.yaml, each overlay given
with --configfile, then --config, as Snakemake merges them. A message that names a key names the
file that set it (an overlay, not always config/config.yaml). Pure: the files' contents come in.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_CONFIG = "config/config.yaml"


def relative_name(path, workdir) -> str:
    """A config file as the user names it: relative to the working directory where it lies in it."""
    try:
        return str(Path(path).resolve().relative_to(Path(workdir).resolve()))
    except ValueError:
        return str(path)


def config_source(files, workdir) -> str:
    """The config files, relative to the working directory where they lie in it.

    Snakemake lists --configfile files before the workflow's own config/config.yaml, though
    they override it: the default comes first here, as the user thinks of it.
    """
    names = list(dict.fromkeys(relative_name(f, workdir) for f in files))
    if DEFAULT_CONFIG in names:
        names.remove(DEFAULT_CONFIG)
        names.insert(0, DEFAULT_CONFIG)
    return " + ".join(names) or DEFAULT_CONFIG


def own_init_args(config: dict, overrides: dict) -> None:
    """A section's init_args come only from the file that names its class.

    Snakemake merges --configfile (and --config) into config/config.yaml key by key, so a preset
    that swaps the model (config/transformer.yaml) would inherit the SpiralMLP's `hidden` and
    the spiral data's `resident`, and every job would fail on an unexpected keyword.
    """
    for section in ("model", "data"):
        override = overrides.get(section) or {}
        if isinstance(override, dict) and "class_path" in override and isinstance(config.get(section), dict):
            init_args = override.get("init_args") or {}
            # anything but a mapping is left for the schema check to name
            config[section]["init_args"] = dict(init_args) if isinstance(init_args, dict) else init_args


def _has(tree, path) -> bool:
    for part in path:
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def set_beyond_default(path, layers: list[tuple[str, dict]]) -> bool:
    """Whether a file other than config/config.yaml (an overlay, --config) sets this key."""
    return any(_has(tree, tuple(path)) for name, tree in layers if name != DEFAULT_CONFIG)


def key_source(path, layers: list[tuple[str, dict]]) -> str:
    """The file that set a key, as the user wrote it: the last layer holding it, layers in
    Snakemake's order (config/config.yaml, each --configfile, then --config); for model/data
    init_args only layers from the last one naming that section's class_path count, since that
    file brings the section's init_args alone (own_init_args). A key no layer sets
    (a schema default) is named with every file."""
    path = tuple(path)
    start = 0
    if len(path) >= 2 and path[0] in ("model", "data") and path[1] == "init_args":
        named = [i for i, (_, tree) in enumerate(layers) if _has(tree, (path[0], "class_path"))]
        start = named[-1] if named else 0
    for name, tree in reversed(layers[start:]):
        if _has(tree, path):
            return name
    return " + ".join(name for name, _ in layers) or DEFAULT_CONFIG
