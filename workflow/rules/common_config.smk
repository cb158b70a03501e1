# The config as the user wrote it, read first: config/config.yaml, the overlays given with
# --configfile and --config, the file that set each key (messages name it), the schema, and a
# LightningCLI config (config lightning_config). Everything after it reads `config` as left here.
import os
import sys

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

# scripts/ddpscale is on sys.path (the Snakefile puts it there before reading the config).
from ddpscale.plan.configcheck import input_problems, schema_problems  # noqa: E402
from ddpscale.plan.configread import read_yaml  # noqa: E402
from ddpscale.plan.configsource import (  # noqa: E402
    DEFAULT_CONFIG,
    config_source,
    key_source,
    own_init_args,
    relative_name,
    set_beyond_default,
)
from ddpscale.run import lightningcli  # noqa: E402

CONFIG_SOURCE = config_source(workflow.configfiles, os.getcwd())


def read_layer(path, where):
    """A config file by ddpscale's one reader (ddpscale.plan.configread): its data, or the
    workflow stops with one line naming the file, the line and the fix."""
    data, problem = read_yaml(path, where)
    if problem:
        raise WorkflowError(problem)
    return data


def config_layers():
    """(file, what it sets) in Snakemake's order: config/config.yaml, each --configfile, --config.

    Snakemake has loaded the --configfile overlays itself before the Snakefile runs (its
    ConfigSettings), so what it cannot read has stopped it already; the rest is refused here."""
    layers = [(DEFAULT_CONFIG, read_layer(DEFAULT_CONFIG, DEFAULT_CONFIG))] if os.path.lexists(DEFAULT_CONFIG) else []
    for path in workflow.config_settings.configfiles:
        where = relative_name(path, os.getcwd())
        layers.append((where, read_layer(path, where) or {}))
    if workflow.config_settings.config:
        layers.append(("--config", dict(workflow.config_settings.config)))
    return layers


CONFIG_LAYERS = config_layers()


def source(path):
    """The file that set a config key (a tuple of its path), for the first words of a message."""
    return key_source(path, CONFIG_LAYERS)


SCHEMA = yaml.safe_load((Path(workflow.basedir) / "schemas/config.schema.yaml").read_text())


def check_config_schema():
    """Snakemake's validate prints the whole schema and config for one bad key; say it in one line.

    validate() still runs after this: it fills in the schema's defaults.
    """
    problems = schema_problems(config, SCHEMA, source)
    if problems:
        raise WorkflowError("\n".join(problems))


# Inputs that cannot work (nested numbers given with --config, an experiment named like a legacy
# folder of results/, data that is the experiment's own output): named before the schema's words.
if problems := input_problems(config, workflow.config_settings.config, source, SCHEMA):
    raise WorkflowError("\n".join(problems))
own_init_args(config, workflow.config_settings.overwrite_config or {})
check_config_schema()
validate(config, schema="../schemas/config.schema.yaml")


def apply_lightning_config():
    """A LightningCLI config (config lightning_config) brings the model, the data and the trainer
    settings that change what is measured (ddpscale.run.lightningcli); what ddpscale sets
    per topology is named in one line. Its values go through the schema like the config's."""
    path = config["lightning_config"]
    if not path:
        return None
    if not Path(path).is_file():
        raise WorkflowError(
            f"{source(('lightning_config',))}: lightning_config is {path!r}, which is not a file (paths are "
            "relative to the directory snakemake runs in); fix the path or set it to null"
        )
    applied = lightningcli.apply(
        read_layer(path, path), config, path, lambda key: set_beyond_default(key, CONFIG_LAYERS)
    )
    if applied.problems:
        raise WorkflowError("\n".join(applied.problems))
    config.clear()
    config.update(applied.config)
    CONFIG_LAYERS.append((path, applied.layer))
    check_config_schema()
    for line in (lightningcli.read_line(path, applied), lightningcli.overridden_line(path, applied)):
        if line:
            print(line, file=sys.stderr)
    return applied


LIGHTNING = apply_lightning_config()
if LIGHTNING:
    CONFIG_SOURCE = f"{CONFIG_SOURCE} + {config['lightning_config']}"
# its optimizer and lr_scheduler, checked with the model and data classes (common.smk, CONTRACT)
CLI_CLASSES = lightningcli.contract_classes(LIGHTNING)
