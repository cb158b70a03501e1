# The config as the user wrote it, read first: config/config.yaml, the overlays given with
# --configfile and --config, the file that set each key (messages name it), the schema, and a
# LightningCLI config (config lightning_config). Everything after it reads `config` as left here.
import os
import sys

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

# scripts/ddpscale is on sys.path (the Snakefile puts it there before reading the config).
from ddpscale.plan.configcheck import read_config, schema_problems, yaml_problem  # noqa: E402
from ddpscale.plan.configcheck import input_problems  # noqa: E402
from ddpscale.plan.configsource import (  # noqa: E402
    DEFAULT_CONFIG,
    config_source,
    key_source,
    own_init_args,
    relative_name,
    set_beyond_default,
)
from ddpscale.plan import lightningcli  # noqa: E402

CONFIG_SOURCE = config_source(workflow.configfiles, os.getcwd())


def config_layers():
    """(file, what it sets) in Snakemake's order: config/config.yaml, each --configfile, --config."""
    layers = (
        [(DEFAULT_CONFIG, yaml.safe_load(Path(DEFAULT_CONFIG).read_text()))] if Path(DEFAULT_CONFIG).is_file() else []
    )
    for path in workflow.config_settings.configfiles:
        where = relative_name(path, os.getcwd())
        text, problem = read_config(path, where)
        if problem or (problem := yaml_problem(text, where)):
            raise WorkflowError(problem)
        layers.append((where, yaml.safe_load(text) or {}))
    if workflow.config_settings.config:
        layers.append(("--config", dict(workflow.config_settings.config)))
    return layers


CONFIG_LAYERS = config_layers()


def source(path):
    """The file that set a config key (a tuple of its path), for the first words of a message."""
    return key_source(path, CONFIG_LAYERS)


def check_config_schema():
    """Snakemake's validate prints the whole schema and config for one bad key; say it in one line.

    validate() still runs after this: it fills in the schema's defaults.
    """
    schema = yaml.safe_load((Path(workflow.basedir) / "schemas/config.schema.yaml").read_text())
    problems = schema_problems(config, schema, source)
    if problems:
        raise WorkflowError("\n".join(problems))


# Inputs that cannot work (nested numbers given with --config, an experiment named like a legacy
# folder of results/, data that is the experiment's own output): named before the schema's words.
if problems := input_problems(config, workflow.config_settings.config, source):
    raise WorkflowError("\n".join(problems))
own_init_args(config, workflow.config_settings.overwrite_config or {})
check_config_schema()
validate(config, schema="../schemas/config.schema.yaml")


def apply_lightning_config():
    """A LightningCLI config (config lightning_config) brings the model, the data and the trainer
    settings that change what is measured (ddpscale.plan.lightningcli); what ddpscale sets
    per topology is named in one line. Its values go through the schema like the config's."""
    path = config["lightning_config"]
    if not path:
        return None
    if not Path(path).is_file():
        raise WorkflowError(
            f"{source(('lightning_config',))}: lightning_config is {path!r}, which is not a file (paths are "
            "relative to the directory snakemake runs in); fix the path or set it to null"
        )
    text = Path(path).read_text()
    problem = yaml_problem(text, where=path)
    if problem:
        raise WorkflowError(problem)
    applied = lightningcli.apply(yaml.safe_load(text), config, path, lambda key: set_beyond_default(key, CONFIG_LAYERS))
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
