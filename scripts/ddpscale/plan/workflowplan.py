"""What the workflow does while it parses, as one program: read the config as the user wrote it
(config/config.yaml, each --configfile, --config, a LightningCLI config) and check it, read the
profile and check it, build the plan of the runs, check the user's modules keep the contract, and
set aside what on disk cannot be used. Everything is checked here, so a bad config, profile or
module stops before any job is submitted, in one line per problem (ParseError).

workflow/rules/common.smk hands over what only Snakemake knows (Given: the config files, the
profile's resources, whether this is the snakemake the user started) and reads the plan back
(Parsed); what needs Snakemake's own objects (its logger, WorkflowError, its DAG, its rules)
stays there. Torch-free: the user's classes are imported in a process of their own
(ddpscale.plan.contractfacts). Last, how a Python interpreter starts the workflow (for the tests
and the benchmarks).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ddpscale.core.layout import LEGACY_RUNS, experiment_name, layout, legacy_note
from ddpscale.run.topology import STAGE_RULES, TopologyError
from ddpscale.plan import contractfacts, runplan
from ddpscale.run import lightningcli
from ddpscale.plan.site import profile
from ddpscale.plan.cost import reservation, timelimit
from ddpscale.plan.config.check import (
    device_problems,
    file_problems,
    input_problems,
    schema_problems,
    setting_problems,
)
from ddpscale.plan.config.read import read_yaml
from ddpscale.plan.config.source import (
    DEFAULT_CONFIG,
    config_source,
    key_source,
    own_init_args,
    relative_name,
    set_beyond_default,
)
from ddpscale.run.usermodule import owned_init_args
from ddpscale.run.usermodule import problems as contract_problems
from ddpscale.run.ddpsettings import torch_built_with_gpu
from ddpscale.run.hostdevices import AcceleratorError, host_memory_mb, usable_cores, visible_gpus
from ddpscale.run.identity import installed_versions
from ddpscale.plan.site.pluginstates import wrap_installed_plugin
from ddpscale.run.usermodule import PluginError, check_importable
from ddpscale.plan.site.resources import SiteError, run_accelerator, signal_problem

# What a cluster executor with no site facts would do, said before anything is submitted.
NO_SITE_FACTS = (
    "set-resources train has no site facts (site_launcher, site_gpus_per_node, ...) but jobs go "
    "to a cluster executor. If you passed --set-resources on the command line, it replaced "
    "the profile's: repeat the profile's site_* entries for train there"
)


class ParseError(Exception):
    """The workflow stops before any job: one line per problem (common.smk raises it as a
    WorkflowError, whose message Snakemake prints without a traceback)."""


def stop_if(problems: list[str]) -> None:
    if problems:
        raise ParseError("\n".join(problems))


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


@dataclass(frozen=True)
class Given:
    """What only Snakemake and the process it runs in know, read by common.smk.

    configfiles: every config file Snakemake read (workflow.configfiles); overlays: the
    --configfile files (config_settings.configfiles); overrides: --config as given, and
    overwrite_config: --configfile and --config merged (config_settings); default_resources and
    overwrite_resources: the profile's (resource_settings); main: whether this is the snakemake
    the user started (a job's own snakemake parses again, already checked); basedir: workflow/.
    """

    configfiles: list = field(default_factory=list)
    overlays: list = field(default_factory=list)
    overrides: dict = field(default_factory=dict)
    overwrite_config: dict = field(default_factory=dict)
    default_resources: object = None
    overwrite_resources: dict = field(default_factory=dict)
    main: bool = True
    argv: list = field(default_factory=lambda: list(sys.argv))
    environ: Mapping = field(default_factory=lambda: dict(os.environ))
    cwd: str = field(default_factory=os.getcwd)
    basedir: str = str(Path(__file__).resolve().parents[3] / "workflow")
    python: str = sys.executable

    @property
    def profile_file(self) -> str:
        """The profile's config.yaml, for the first words of a message about it."""
        return profile.profile_file(self.argv, self.environ)

    @property
    def schema(self) -> dict:
        return yaml.safe_load((Path(self.basedir) / "schemas/config.schema.yaml").read_text())


# --- 1. The config as the user wrote it ---


def read_layer(path, where) -> dict | None:
    """A config file by ddpscale's one reader (ddpscale.plan.config.read): its data, or the
    workflow stops with one line naming the file, the line and the fix."""
    data, problem = read_yaml(path, where)
    if problem:
        raise ParseError(problem)
    return data


def config_layers(given: Given) -> list[tuple[str, dict]]:
    """(file, what it sets) in Snakemake's order: config/config.yaml, each --configfile, --config.

    Snakemake has loaded the --configfile overlays itself before the Snakefile runs (its
    ConfigSettings), so what it cannot read has stopped it already; the rest is refused here."""
    default = Path(given.cwd) / DEFAULT_CONFIG
    layers = [(DEFAULT_CONFIG, read_layer(default, DEFAULT_CONFIG))] if os.path.lexists(default) else []
    for path in given.overlays:
        where = relative_name(path, given.cwd)
        layers.append((where, read_layer(path, where) or {}))
    if given.overrides:
        layers.append(("--config", dict(given.overrides)))
    return layers


@dataclass
class ConfigRead:
    """The config's files as read (layers, each with what it sets), named for messages."""

    layers: list[tuple[str, dict]]
    config_source: str
    lightning: object = None

    def source(self, path) -> str:
        """The file that set a config key (a tuple of its path), for the first words of a message."""
        return key_source(path, self.layers)

    @property
    def cli_classes(self):
        """The LightningCLI config's optimizer and lr_scheduler, checked with the model and data."""
        return lightningcli.contract_classes(self.lightning)


def check_schema(config: dict, schema: dict, read: ConfigRead) -> None:
    """Snakemake's validate prints the whole schema and config for one bad key; say it in one line.

    validate() still runs after this: it fills in the schema's defaults."""
    stop_if(schema_problems(config, schema, read.source))


def apply_lightning_config(config: dict, read: ConfigRead, schema: dict, say=to_stderr):
    """A LightningCLI config (config lightning_config) brings the model, the data and the trainer
    settings that change what is measured (ddpscale.run.lightningcli); what ddpscale sets
    per topology is named in one line. Its values go through the schema like the config's."""
    path = config["lightning_config"]
    if not path:
        return None
    if not Path(path).is_file():
        raise ParseError(
            f"{read.source(('lightning_config',))}: lightning_config is {path!r}, which is not a file (paths are "
            "relative to the directory snakemake runs in); fix the path or set it to null"
        )
    applied = lightningcli.apply(
        read_layer(path, path), config, path, lambda key: set_beyond_default(key, read.layers)
    )
    stop_if(applied.problems)
    config.clear()
    config.update(applied.config)
    read.layers.append((path, applied.layer))
    check_schema(config, schema, read)
    for line in (lightningcli.read_line(path, applied), lightningcli.overridden_line(path, applied)):
        if line:
            say(line)
    return applied


def read_config(config: dict, given: Given, fill_defaults: Callable[[dict], None], say=to_stderr) -> ConfigRead:
    """The config checked and completed in place: inputs that cannot work, the schema in one line
    per key, the schema's defaults (fill_defaults: Snakemake's validate), a LightningCLI config."""
    read = ConfigRead(config_layers(given), config_source(given.configfiles, given.cwd))
    schema = given.schema
    # Inputs that cannot work (nested numbers given with --config, an experiment named like a legacy
    # folder of results/, data that is the experiment's own output): named before the schema's words.
    stop_if(input_problems(config, given.overrides, read.source, schema))
    own_init_args(config, given.overwrite_config or {})
    check_schema(config, schema, read)
    fill_defaults(config)
    read.lightning = apply_lightning_config(config, read, schema, say)
    if read.lightning:
        read.config_source = f"{read.config_source} + {config['lightning_config']}"
    return read


# --- 2. The profile: its resources as written, checked, and the site facts in them ---


def read_profile(given: Given) -> profile.Profile:
    """The profile's resources checked (ddpscale.plan.site.profile) where the user started the
    workflow (a job's own snakemake gets the resources again, already checked), and read."""
    default, overwrite = given.default_resources, given.overwrite_resources
    try:
        if given.main:
            stop_if(profile.problems(given.profile_file, default, overwrite))
        return profile.read(default, overwrite)
    except SiteError as err:
        raise ParseError(str(err)) from err


def check_retries(site_profile: profile.Profile, given: Given, say=to_stderr) -> None:
    """A cluster profile's retries and the plugin's requeue setting (ddpscale.plan.site.profile):
    retries while SLURM may requeue are refused, no retries are said. Read from the profile's
    file and the command line: Snakemake sets them only after the workflow has parsed."""
    if site_profile.site.is_local or not given.main:
        return
    where = given.profile_file
    settings = profile.retry_settings(profile.written(where), given.argv[1:])
    refused, notes = profile.retry_problems(where, *settings)
    stop_if(refused)
    for note in notes:
        say(f"ddpscale: {note}")


# --- 3. The plan of the runs, then the checks that need it ---


def build_plan(config: dict, read: ConfigRead, site_profile: profile.Profile, given: Given) -> runplan.RunPlan:
    """The plan of this experiment's runs (ddpscale.plan.runplan), with this host's devices where
    the runs train on it, and the user's model and data classes findable where the jobs run."""
    local = site_profile.site.is_local
    try:
        plan = runplan.build(
            config,
            site_profile.site,
            config_source=read.config_source,
            lightning=read.lightning,
            python=given.python,
            # torch and Lightning as installed (package metadata, no import)
            versions=installed_versions(),
            # only the local profile runs on this host (nvidia-smi: a second at most)
            gpus=visible_gpus() if local else None,
            cores=usable_cores() if local else None,
            memory_mb=host_memory_mb() if local else None,
            source=read.source,
            # what finished runs held their devices for besides measuring (ddpscale.plan.cost.timelimit)
            measured_setup_s=timelimit.measured_setups(runplan.finished_records(layout(config))),
        )
        for key in ("model", "data"):
            # jobs run in this working directory and train.py imports from it first
            check_importable(
                config[key]["class_path"], f"{read.source((key, 'class_path'))}: {key}.class_path", root=given.cwd
            )
    except (TopologyError, AcceleratorError, PluginError) as err:
        raise ParseError(str(err)) from err
    return plan


def start_contract(config: dict, read: ConfigRead, plan: runplan.RunPlan, given: Given) -> contractfacts.Pending:
    """The user's classes imported (seconds: torch) in a process of their own while the other
    checks run, unless their files are unchanged since the last time (ddpscale.plan.contractfacts)."""
    return contractfacts.start(
        plan.python,
        str(Path(given.basedir).parent / "scripts/contract.py"),
        config["model"]["class_path"],
        config["data"]["class_path"],
        given.cwd,
        plan.versions,
        read.cli_classes,
    )


def check_settings(config: dict, read: ConfigRead, plan: runplan.RunPlan) -> None:
    """Keys that only work together, a generated dataset too small for a batch of every topology,
    data files that are missing or not regular files; then settings the runs' devices cannot run
    (SyncBatchNorm on CPU processes: 1x1 would train and the first DDP topology die, leaving no
    report)."""
    topologies = list(plan.topologies)
    stop_if(setting_problems(config, topologies, read.config_source) + file_problems(config, read.config_source))
    stop_if(device_problems(
        config,
        run_accelerator(plan.accelerator, plan.site),
        topologies,
        read.lightning.trainer_args if read.lightning else {},
        read.source,
        torch_built_with_gpu(),
    ))


def check_contract(config: dict, read: ConfigRead, pending: contractfacts.Pending) -> None:
    """The modules keep the contract (docs/your-model.md): classes that import, are what
    they must be, and take what the config and the workflow give them; refused here, not in a job."""
    try:
        facts = contractfacts.finish(pending)
    except ValueError as err:
        raise ParseError(f"{read.source(('model', 'class_path'))}: {err}") from err
    stop_if(owned_init_args(config, read.source) + contract_problems(facts, config, read.source, read.cli_classes))


def check_disk(plan: runplan.RunPlan, read: ConfigRead, given: Given, say=to_stderr) -> None:
    """A damaged run record is renamed so its run trains again (a job's own parse leaves that to
    the snakemake that scheduled it); finished runs of another workload, a damaged dataset, a
    missing report to compare with are refused; the plan's notes are said."""
    if given.main:
        for line in runplan.set_aside_unreadable(plan):
            say(f"ddpscale: {line}")
    stop_if(runplan.disk_problems(plan, read.source, set_aside_here=given.main))
    for note in plan.notes:
        say(f"ddpscale: {note}")


@dataclass
class Parsed:
    """What the rules read: the plan of the runs, the profile's facts, and the config as read."""

    plan: runplan.RunPlan
    profile: profile.Profile
    read: ConfigRead


def build(config: dict, given: Given, fill_defaults: Callable[[dict], None], say=to_stderr) -> Parsed:
    """The whole program, in the order the workflow has always run it: config, experiment, profile,
    plan, contract and settings, disk. config is completed in place (the schema's defaults, a
    LightningCLI config); lines for the user go to say; a refusal raises ParseError."""
    read = read_config(config, given, fill_defaults, say)
    # Each experiment writes to results/<experiment>/ (ddpscale.core.layout): another config never
    # replaces this one's runs or report.
    say(f"ddpscale: experiment {experiment_name(config)}: results in {layout(config).root}/")
    if Path(LEGACY_RUNS).is_dir():
        say(f"ddpscale: note: {legacy_note(experiment_name(config))}")
    site_profile = read_profile(given)
    check_retries(site_profile, given, say)
    # sacct's "CANCELLED by <uid>" must read as failed to the plugin, or a job cancelled with
    # scancel is polled as running forever (ddpscale.plan.site.pluginstates); where the user started it
    for note in [*site_profile.notes, wrap_installed_plugin() if given.main else None]:
        if note:
            say(f"ddpscale: {note}")
    plan = build_plan(config, read, site_profile, given)
    pending = start_contract(config, read, plan, given)
    check_settings(config, read, plan)
    check_contract(config, read, pending)
    check_disk(plan, read, given, say)
    return Parsed(plan, site_profile, read)


# --- After the rules: what Snakemake's objects bring ---


def time_limits(parsed: Parsed, given: Given) -> dict:
    """Each training stage's time limit in minutes as the plan sizes it (ddpscale.plan.cost.timelimit);
    None leaves the profile's. The profile's own limits were checked with the site
    (profile.read); these may be shorter, and must still leave the job time for its signal."""
    limits = parsed.plan.job_runtimes(parsed.profile.runtimes)
    stop_if([
        f"{given.profile_file}: {rule}: {why}"
        for rule, minutes in limits.items()
        if (why := signal_problem(parsed.profile.site, minutes))
    ])
    return limits


def executor_problem(plan: runplan.RunPlan, non_local_exec: bool) -> str | None:
    """A cluster executor with no site facts would start every rank on one node (happens when
    --set-resources on the command line replaces the profile's)."""
    return NO_SITE_FACTS if non_local_exec and plan.site.is_local else None


def dag_decisions(plan: runplan.RunPlan, dag) -> dict:
    """{(topology, repeat): reservation.Decision} for each training job of Snakemake's DAG:
    whether it runs, as its rerun triggers decided (a missing record, params, input set, code, an
    input newer than the record, an incomplete marker, -R or --forceall), and why."""
    decided = {}
    for job in dag.jobs:
        if job.rule.name not in STAGE_RULES.values():
            continue
        key = (job.wildcards.topology, int(job.wildcards.repeat))
        finished, runs, why = plan.finished(*key), dag.needrun(job), ""
        if runs and finished:
            reason = dag.reason(job)
            why = reservation.rerun_reason(list(reason.get_names()), [str(f) for f in reason.updated_input])
        elif not runs and not finished:
            why = reservation.NOT_SCHEDULED
        decided[key] = reservation.Decision(finished, runs, why)
    return decided


def reservation_lines(parsed: Parsed, dag) -> list[str]:
    """What the benchmark reserves, counting the jobs Snakemake's DAG runs; a Snakemake whose DAG
    reads otherwise must not cost the user the dry run: counted by the records on disk then."""
    try:
        decided, lines = dag_decisions(parsed.plan, dag), []
    except Exception as err:  # noqa: BLE001
        decided = None
        lines = [
            (f"ddpscale: note: Snakemake's decision per job could not be read ({type(err).__name__}: {err}); "
             "counted by the records on disk, so a finished run that Snakemake reruns is left out")
        ]
    return lines + parsed.plan.reservation_lines(parsed.profile.runtimes, decided)


# --- How a Python interpreter starts the workflow, for the tests and the benchmarks ---
# The console script beside the interpreter is what README and `make run` use, and it is the
# one that must find a user's module at the repository root (`python -m snakemake` puts the
# working directory on sys.path and so hides a module the console script would not find).
# A GPU node's shared Python, or an image without `make setup`'s venv, has snakemake
# importable but no console script beside it: there `python -m snakemake` starts the same
# workflow.


def snakemake_command() -> list[str] | None:
    """The argv prefix that starts snakemake with this interpreter: the console script beside
    it, else `python -m snakemake` where snakemake is importable, else None."""
    console = Path(sys.executable).parent / "snakemake"
    if console.is_file():
        return [str(console)]
    if importlib.util.find_spec("snakemake") is not None:
        return [sys.executable, "-m", "snakemake"]
    return None


def workflow_python(command: list[str]) -> str:
    """The interpreter the workflow's jobs run with: the console script's shebang (which may
    name python3 where the caller runs python), else the interpreter of `python -m`."""
    if len(command) > 1:
        return command[0]
    first = Path(command[0]).read_text(errors="replace").splitlines()[:1]
    shebang = first[0][2:].strip() if first and first[0].startswith("#!") else ""
    return shebang if shebang and " " not in shebang else sys.executable
