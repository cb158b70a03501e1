"""What a profile gives the workflow: its resources as written, checked, the site facts in them
and each stage's time limit, read once while the workflow parses.

Snakemake passes any resource name on without a word and the SLURM plugin reads only the names
it knows, so a name it does not know is dropped silently: `slurm_qos: long` submits under the
default QOS, and the job is refused or runs where the user did not mean it. A placeholder the
user was to replace (`slurm_account: my_account`) is submitted as is. Both are refused while
the workflow is parsed, before any sbatch, naming the profile's file, the entry and the fix.

A profile's resource that is not a number is Python to Snakemake: it evaluates it when it builds
each job, and the SLURM plugin writes several resources (mem_mb_per_cpu, tasks, cpus_per_task,
slurm_extra...) into sbatch's shell line unquoted. So every value is held here, before any job is
built, to a literal of its kind (resource_literal_problem); nothing else of a profile is evaluated.
The workflow hands over Snakemake's default-resources and set-resources as they are
(workflow.resource_settings): Snakemake gives a resource callable no access to other
resources, so the site facts are read here, once, for every stage.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import inspect
import re
from dataclasses import dataclass

from ddpscale.run.topology import STAGE_RULES
from ddpscale.plan.site.resources import (
    NAME_TEXT,
    SITE_PREFIX,
    Site,
    SiteError,
    check_stage_entry,
    shared_resources,
    signal_problem,
    site_from_resources,
    slurm_extra_problem,
)

# Snakemake's own resources (snakemake.resources), used by any executor.
SNAKEMAKE = {"mem", "mem_mb", "mem_mib", "disk", "disk_mb", "disk_mib", "runtime", "tmpdir", "threads",
             "_cores", "_nodes"}
# The names snakemake-executor-plugin-slurm 2.8.0 reads from a job's resources (its
# submit_string.py, partitions.py and __init__.py).
PLUGIN = {"slurm_account", "slurm_partition", "slurm_cluster", "cluster", "clusters", "constraint", "qos",
          "mem_mb_per_cpu", "nodes", "tasks", "tasks_per_node", "tasks_per_gpu", "cpus_per_task",
          "cpus_per_gpu", "gpu", "gpu_model", "gres", "mpi", "slurm_extra"}
KNOWN = SNAKEMAKE | PLUGIN
# Names users bring from sbatch, from older Snakemake SLURM profiles or from this project's
# own earlier README (slurm_qos), with the plugin's name for each.
SAID_OTHERWISE = {"slurm_qos": "qos", "slurm_constraint": "constraint", "partition": "slurm_partition",
                  "account": "slurm_account", "time": "runtime", "time_min": "runtime", "walltime": "runtime",
                  "mem_per_cpu": "mem_mb_per_cpu", "ntasks": "tasks", "ntasks_per_node": "tasks_per_node",
                  "gpus": "gpu", "qos_name": "qos"}
# Values shipped in the profiles for the user to replace.
PLACEHOLDERS = {"slurm_account": {"my_account"}}


def suggestion(name: str) -> str:
    if name in SAID_OTHERWISE:
        return f"the SLURM plugin's name for it is {SAID_OTHERWISE[name]}"
    close = difflib.get_close_matches(name, sorted(KNOWN), n=1)
    return f"did you mean {close[0]}?" if close else "known: " + ", ".join(sorted(PLUGIN))


def resource_problems(where: str, entry: str, resources: dict) -> list[str]:
    """One line per name the plugin would drop and per placeholder value, for one profile entry
    (`default-resources`, or `set-resources <rule>`) of the profile file `where`. Site facts
    (site_*) are checked with the site (ddpscale.plan.site.resources)."""
    problems = []
    for name, value in resources.items():
        if name.startswith(SITE_PREFIX):
            continue
        if name not in KNOWN:
            problems.append(f"{where}: {entry} sets '{name}', which the SLURM plugin does not read and "
                            f"drops without a word; {suggestion(name)}")
        elif str(value).strip() in PLACEHOLDERS.get(name, ()):
            problems.append(f"{where}: {entry} {name} is still the placeholder {value!r}; set your own "
                            f"(the accounts you may charge: sacctmgr show associations user=$USER format=account)")
    return problems


# The plugin's resource (or ddpscale's site fact) for each sbatch option its validation.py refuses
# inside slurm_extra, keyed by the name it gives the option there.
RESOURCE_FOR_OPTION = {"node constraints": "constraint", "quality of service": "qos", "account": "slurm_account",
                       "partition": "slurm_partition", "runtime/time limit": "runtime", "memory": "mem_mb",
                       "memory per CPU": "mem_mb_per_cpu", "cluster specification": "clusters",
                       "generic resources (GRES)": "site_gpu_type (ddpscale computes --gres per topology)",
                       "GPU allocation": "site_gpus_per_node (ddpscale computes --gres per topology)",
                       "CPUs per task": "site_cpus_per_gpu", "number of tasks": "the topology",
                       "number of nodes": "the topology"}


def slurm_extra_problems(where: str, entry: str, flags: str, forbidden: dict[str, str]) -> list[str]:
    """One line per sbatch option in a profile's site_slurm_extra that the plugin refuses there
    (`forbidden`: its validation.get_forbidden_slurm_options(), pattern -> option name). The
    plugin says so only when it submits the job, after the jobs before it ran."""
    problems = []
    for pattern, option in forbidden.items():
        if re.search(pattern, flags):
            fix = RESOURCE_FOR_OPTION.get(option, "the plugin's resource for it")
            problems.append(f"{where}: {entry} {SITE_PREFIX}slurm_extra {flags!r} sets the {option}, which the "
                            f"SLURM plugin refuses inside slurm_extra; set it with {fix} instead")
    return problems


def profile_file(argv: list[str], env: dict) -> str:
    """The profile's file as the user named the profile (--profile, else SNAKEMAKE_PROFILE), for
    messages; Snakemake keeps no record of it."""
    for i, arg in enumerate(argv):
        if arg == "--profile" and i + 1 < len(argv):
            return f"{argv[i + 1].rstrip('/')}/config.yaml"
        if arg.startswith("--profile="):
            return f"{arg.split('=', 1)[1].rstrip('/')}/config.yaml"
    if env.get("SNAKEMAKE_PROFILE"):
        return f"{env['SNAKEMAKE_PROFILE'].rstrip('/')}/config.yaml"
    return "the profile"


@dataclass(frozen=True)
class Profile:
    site: Site
    # what set-resources `train` sets besides site facts (runtime, partition...), for every stage
    shared: dict
    runtimes: dict  # {train_<stage>: its time limit in minutes, or None}
    notes: tuple[str, ...] = ()  # said to the user while the workflow parses


def written_value(resource):
    """One resource as the profile (or the command line) wrote it: an int, or the text Snakemake
    will evaluate. Snakemake keeps it as `raw`, except for an expression given as mem or disk,
    which it renames mem_mb or disk_mb in a wrapper without one (snakemake.resources,
    Resource.standardize_size): the wrapper holds the Resource it wraps, which has it."""
    raw = getattr(resource, "raw", resource)
    evaluator = getattr(resource, "_evaluator", None)
    if raw is None and evaluator is not None:
        wrapped = inspect.getclosurevars(evaluator).nonlocals.get("self")
        return getattr(wrapped, "raw", None)
    return raw


def as_written(resources) -> dict:
    """Resources as the values the profile wrote (Snakemake keeps them as Resource objects)."""
    return {name: written_value(value) for name, value in (resources or {}).items()}


# The resources that are whole numbers: Snakemake's sizes and time, and the counts the plugin
# writes into sbatch's line unquoted (--mem-per-cpu, --ntasks, --cpus-per-task...). Snakemake
# reads "8G" or "2h" for mem, disk and runtime into a number before the workflow sees it.
INTEGER = {"mem", "mem_mb", "mem_mib", "disk", "disk_mb", "disk_mib", "runtime", "threads", "_cores", "_nodes",
           "mem_mb_per_cpu", "nodes", "tasks", "tasks_per_node", "tasks_per_gpu", "cpus_per_task",
           "cpus_per_gpu", "gpu"}
# A count above this is a typo, and SLURM keeps its counts and minutes in 32 bits.
LARGEST = 2**31 - 1
# Zero means nothing to SLURM for these (a job without time, on no node).
POSITIVE = {"runtime", "nodes", "_nodes", "threads", "_cores"}
# The plugin's own grammars for a GRES and a GPU model (its utils.set_gres_string): it refuses
# others only when it submits the job.
GRES = re.compile(r"[a-zA-Z0-9_]+(:[a-zA-Z0-9_.]+)?(:\d+[TGM]?)?")
GPU_MODEL = re.compile(r"[a-zA-Z0-9_.]+")
# tmpdir is a path Snakemake creates and exports for the job: no shell syntax, no $ or ~ (which
# Snakemake expands itself).
PATH_TEXT = re.compile(r"[A-Za-z0-9_./-]+")
TEXT = {"gres": (GRES, "a GRES such as gpu:a100:4"), "gpu_model": (GPU_MODEL, "letters, digits, _ and ."),
        "tmpdir": (PATH_TEXT, "a path of letters, digits and _ . / -")}
NAME_FIX = "letters, digits and _ . , : & | [ ] * -"
# The names Snakemake gives a resource expression besides Python's builtins (resources.py,
# Resource.cli_evaluator; the snakemake.ioutils functions are added in snakemake_names).
EVALUATOR_NAMES = {"wildcards", "input", "attempt", "threads", "system_tmpdir", "shutil", "async_run", "rulename"}


def snakemake_defaults() -> dict:
    """Snakemake's own default resources as it names them once read (mem -> mem_mb): a profile
    gets them with a bare --default-resources, and on a cluster executor without any."""
    from snakemake.resources import Resources

    full = Resources.DEFAULTS["full"]
    return {f"{name}_mb" if name in ("mem", "disk") else name: text for name, text in full.items()}


def snakemake_names() -> set[str]:
    """Every name a resource expression can use, so that text naming one is no text to Snakemake."""
    import snakemake.ioutils

    namespace = {}
    snakemake.ioutils.register_in_globals(namespace)
    return set(dir(builtins)) | EVALUATOR_NAMES | set(namespace)


def evaluated_as_python(text: str, names: set[str]) -> bool:
    """Whether Snakemake, which evaluates a resource's text and keeps the text only where that
    fails with a NameError or a SyntaxError, would give the plugin something else than the text."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    nodes = list(ast.walk(tree))
    if any(isinstance(node, ast.Lambda) for node in nodes):
        return True
    return not {node.id for node in nodes if isinstance(node, ast.Name)} - names


def resource_literal_problem(name: str, value, names: set[str]) -> str | None:
    """Why one resource's value as written is not a literal of its kind, or None: a whole number
    for sizes, time and counts, else text of a narrow grammar, never Python to evaluate."""
    if value is not None and value == snakemake_defaults().get(name):
        return None
    if name in INTEGER:
        low = 1 if name in POSITIVE else 0
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= LARGEST:
            return None
        unit = {"runtime": "minutes (or a duration such as '2h')"}.get(
            name, "MB (or a size such as '8G' for mem)" if name.startswith(("mem", "disk")) else "a count")
        return (f"{name} must be a whole number from {low} to {LARGEST}, in {unit} (got {value!r}); Snakemake "
                f"evaluates anything else as Python and the SLURM plugin writes it into sbatch's shell line")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return None
    if not isinstance(value, str):
        return f"{name} must be text or a whole number (got {value!r})"
    if name == "slurm_extra":
        return slurm_extra_problem(value, name)
    grammar, fix = TEXT.get(name, (NAME_TEXT, NAME_FIX))
    # Snakemake's own quoting of text (`qos: "'long'"`, or a YAML string of digits)
    inner = value[1:-1] if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"" else None
    if inner is not None and grammar.fullmatch(inner):
        return None
    if not grammar.fullmatch(value):
        return (f"{name} {value!r} is not a plain value: write {fix} only; Snakemake evaluates other text as "
                f"Python, and the SLURM plugin passes it to sbatch through a shell")
    if evaluated_as_python(value, names):
        return (f"{name} {value!r} is a Python expression to Snakemake, which would give the SLURM plugin its "
                f"value instead; quote it as text: {name}: \"'{value}'\"")
    return None


def runtime_minutes(resources) -> int | None:
    """The `runtime` of one profile entry in minutes, as Snakemake reads it ("2h" is 120);
    None where the entry sets none or sets an expression evaluated per job."""
    from snakemake.exceptions import WorkflowError
    from snakemake.resources import Resource

    value = (resources or {}).get("runtime")
    if value is None:
        return None
    try:
        value = value if isinstance(value, Resource) else Resource("runtime", value)
    except WorkflowError:
        return None
    if value.is_evaluable() or not isinstance(value.value, int):
        return None
    return value.value


def forbidden_options() -> dict[str, str]:
    """The sbatch options the installed SLURM plugin refuses inside slurm_extra (its own list, so
    the check follows the plugin)."""
    from snakemake_executor_plugin_slurm.validation import get_forbidden_slurm_options

    return get_forbidden_slurm_options()


def problems(where: str, default, overwrite: dict) -> list[str]:
    """Every resource name the plugin would drop, placeholder left, and sbatch option the plugin
    refuses in site_slurm_extra, one line each; where: the profile's file."""
    entries = {"default-resources": as_written(default)}
    entries.update({f"set-resources {rule}": as_written(values) for rule, values in overwrite.items()})
    found = [line for entry, values in entries.items() for line in resource_problems(where, entry, values)]
    found += literal_problems(where, entries)
    extra = str(entries.get("set-resources train", {}).get(f"{SITE_PREFIX}slurm_extra", ""))
    if extra.strip():
        found += slurm_extra_problems(where, "set-resources train", extra, forbidden_options())
    return found


def literal_problems(where: str, entries: dict) -> list[str]:
    """One line per resource of every entry (default-resources, set-resources <rule>) that is not
    a literal of its kind; site facts are the site's to check (ddpscale.plan.site.resources)."""
    names = snakemake_names()
    found = []
    for entry, values in entries.items():
        for name, value in values.items():
            if name in KNOWN and (problem := resource_literal_problem(name, value, names)):
                found.append(f"{where}: {entry} {problem}")
    return found


def stage_runtime(rule: str, stage_entries: dict, train: int | None, default: int | None) -> int | None:
    """A stage rule's time limit in minutes as Snakemake applies the profile: the stage's own
    set-resources entry wins over `train`'s (given to every stage as the rule's own resource),
    which wins over default-resources (only for resources a rule does not set)."""
    own = stage_entries.get(rule)
    if own is not None:
        return own
    return train if train is not None else default


def read(default, overwrite: dict) -> Profile:
    """The site facts of set-resources `train` (a SiteError names a misplaced or invalid one),
    what it gives every stage, and each stage's time limit as Snakemake applies the profile."""
    for rule in STAGE_RULES.values():
        check_stage_entry(rule, as_written(overwrite.get(rule)))
    train = as_written(overwrite.get("train"))
    stages = {rule: runtime_minutes(overwrite.get(rule)) for rule in STAGE_RULES.values()}
    train_limit, default_limit = runtime_minutes(overwrite.get("train")), runtime_minutes(default)
    notes = []
    if "probe" in overwrite:
        notes.append("warning: the profile's set-resources entry `probe` is unused now that the probe runs "
                     "inside each topology's first training job; remove that entry")
    site = site_from_resources(train)
    runtimes = {rule: stage_runtime(rule, stages, train_limit, default_limit) for rule in STAGE_RULES.values()}
    for rule, minutes in runtimes.items():
        if problem := signal_problem(site, minutes):
            raise SiteError(f"profile set-resources train: {problem} ({rule}'s runtime is {minutes} min)")
    return Profile(site=site, shared=shared_resources(train), runtimes=runtimes, notes=tuple(notes))


# How Snakemake and the SLURM plugin may spell the retry settings, in a profile and on the
# command line (snakemake's cli.py: --retries, --restart-times, -T; the plugin's requeue and
# no_requeue settings as --slurm-requeue, --slurm-no-requeue).
RETRY_NAMES = ("retries", "restart-times", "restart_times")
RETRY_FLAGS = ("--retries", "--restart-times", "-T")
REQUEUE_NAMES = {"slurm-requeue": True, "slurm_requeue": True, "slurm-no-requeue": False, "slurm_no_requeue": False}
# The fix the messages name (docs/clusters.md, "An unattended night", says why these values).
RETRY_FIX = "retries: 2 and slurm-no-requeue: true"


def written(path: str) -> dict:
    """The profile's file as YAML; {} where there is none to read (a profile Snakemake found by
    name elsewhere, or "the profile" of profile_file)."""
    from ddpscale.plan.config.read import read_yaml

    data = read_yaml(path)[0]  # None where it cannot be read, as before, but never a traceback
    return data if isinstance(data, dict) else {}


def retry_settings(written: dict, argv: list[str]) -> tuple[int, bool | None]:
    """(retries, requeue) as Snakemake will apply them: the command line over the profile's file
    (written: its YAML). requeue: True for --slurm-requeue, False for --slurm-no-requeue, None for
    neither (the site's JobRequeue decides). Read here because Snakemake sets its execution and
    executor settings only after the workflow has parsed."""
    retries = next((written[name] for name in RETRY_NAMES if written.get(name) is not None), 0)
    requeue = next((value for name, value in REQUEUE_NAMES.items() if written.get(name) is True), None)
    for i, arg in enumerate(argv):
        flag, _, value = arg.partition("=")
        if flag in RETRY_FLAGS:
            retries = value if value else (argv[i + 1] if i + 1 < len(argv) else retries)
        elif flag in ("--slurm-requeue", "--slurm-no-requeue"):
            requeue = flag == "--slurm-requeue"
    try:
        return int(retries), requeue
    except (TypeError, ValueError):
        return 0, requeue  # Snakemake itself refuses a retries that is not a number


def retry_problems(where: str, retries: int, requeue: bool | None) -> tuple[list[str], list[str]]:
    """(refusals, notes) for a cluster profile's retries and requeue.

    Retries without --no-requeue are refused: where the site requeues a job that lost its node
    (SLURM's default JobRequeue=1), SLURM restarts it while Snakemake, told NODE_FAIL, submits it
    again, and two jobs train into one checkpoint. No retries is said, not refused: it is safe,
    only a run that hits its time limit or loses its node waits for the next snakemake."""
    if retries > 0 and requeue is not False:
        how = "--slurm-requeue asks" if requeue else "the site's JobRequeue (SLURM's default: 1) lets"
        return [f"{where}: retries is {retries}, but {how} SLURM requeue a job that lost its node while "
                f"Snakemake also submits it again: two jobs would train into one checkpoint; set "
                f"slurm-no-requeue: true in the profile (and no slurm-requeue)"], []
    if retries <= 0:
        return [], [f"note: {where} sets no retries: a training job that hits its time limit or loses its node "
                    f"is not resubmitted, and resumes only when you run snakemake again; set {RETRY_FIX} "
                    f"(docs/clusters.md, An unattended night)"]
    return [], []
