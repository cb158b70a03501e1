"""The plan of one experiment's runs: which topologies and repeats, in which stage, on which
accelerator, where each run's files go and each run's spec (ddpscale.run.runspec).

The workflow builds it once while it parses (workflow/rules/common.smk), from the checked
config, the site read from the profile and what this host has, and every rule's inputs,
resources and flags are one-line lookups into it. Building it is pure: the host's GPUs and
cores are handed in. What must look at files already on disk (finished runs, the generated
data, the report to compare with) is in disk_problems, run after the module contract check.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable
from pathlib import Path

from ddpscale.core import earliertable
from ddpscale.core import record as run_record
from ddpscale.core.io import set_aside
from ddpscale.core.layout import Layout, layout, other_workload
from ddpscale.core.spiral import corruption, manifest_path_for
from ddpscale.core.steadystate import Rule
from ddpscale.plan import planfile
from ddpscale.plan.cost import reservation, throughputfit, timelimit
from ddpscale.plan.site.resources import Site, cluster_env, launch_prefix, run_accelerator, slurm_resources
from ddpscale.run import argsfile, measuremode, runspec
from ddpscale.run.hostdevices import (choose_accelerator, oversubscription_warning, unholdable,
                                      unholdable_message)
from ddpscale.run.identity import generated_with_other_settings
from ddpscale.run.topology import (Topology, TopologyError, batch_per_device, check_topologies, name_pattern,
                                    parse_topology, stage_topologies)


@dataclass(frozen=True)
class RunPlan:
    config: dict  # checked, with the schema's defaults filled in
    config_source: str  # the files the config came from: the first words of its messages
    site: Site
    measure: str  # throughput or full (ddpscale.run.measuremode)
    throughput: Rule  # config throughput: whole, the stopping rule every run carries (ddpscale.core.steadystate)
    topologies: tuple[Topology, ...]
    repeats: tuple[int, ...]
    # The accelerator of every run; locally decided once for this host, so a report never
    # mixes GPU and CPU rows (ddpscale.run.hostdevices)
    accelerator: str
    gpu_ids: tuple[str, ...] | None  # the GPUs the local launcher hands out; None: none or a cluster's
    local_threads: int | None  # each local rank's CPU threads; None: a cluster rank gets cpus-per-task
    lightning: object | None  # a LightningCLI config's parts (ddpscale.run.lightningcli), or None
    python: str  # the interpreter running Snakemake, also the one inside jobs
    versions: dict  # torch and Lightning as installed
    notes: tuple[str, ...] = ()  # what the user is told while the workflow parses
    # {topology: the most seconds a finished throughput-mode run held its devices besides
    # measuring}, read from this experiment's records by the workflow (timelimit.measured_setups)
    measured_setup_s: dict = field(default_factory=dict)
    _specs: dict = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def layout(self) -> Layout:
        return layout(self.config)

    @property
    def experiment(self) -> str:
        return Path(self.layout.root).name

    @property
    def generated(self) -> bool:
        return self.config["dataset"]["generator"] != "none"

    @property
    def generator_file(self) -> str:
        """Where config dataset.generator writes its dataset (rule prepare_data)."""
        return f"{self.layout.data}/{self.config['dataset']['generator']}/data.npz"

    @property
    def data_file(self) -> str | None:
        """The generated dataset, or None where the user's module reads its own files."""
        return self.generator_file if self.generated else None

    @property
    def generated_files(self) -> list[str]:
        return [self.data_file, manifest_path_for(self.data_file)] if self.generated else []

    def data_settings_changed(self) -> bool:
        """Whether the generated data on disk was made with other dataset settings (it reads the
        manifest): then the data changes, and every run made from it must rerun."""
        return self.generated and generated_with_other_settings(manifest_path_for(self.data_file),
                                                                self.config["dataset"])

    @property
    def topology_names(self) -> list[str]:
        return [t.name for t in self.topologies]

    @cached_property
    def stage_topologies(self) -> dict[str, list[str]]:
        """{stage: its topology names}: rule train_<stage> trains exactly these."""
        return stage_topologies(list(self.topologies), self.config["baseline"])

    def stage_pattern(self, stage: str) -> str:
        return name_pattern(self.stage_topologies[stage])

    def runs(self, topologies: list[str] | None = None) -> list[tuple[str, int]]:
        names = self.topology_names if topologies is None else topologies
        return [(name, repeat) for name in names for repeat in self.repeats]

    def metrics(self, topologies: list[str] | None = None) -> list[str]:
        return [self.layout.metrics(name, repeat) for name, repeat in self.runs(topologies)]

    def finished(self, topology: str, repeat) -> bool:
        """Whether a run's record exists (Snakemake then does not rerun it)."""
        return Path(self.layout.metrics(topology, repeat)).exists()

    def finished_metrics(self) -> list[str]:
        return [self.layout.metrics(name, repeat) for name, repeat in self.runs() if self.finished(name, repeat)]

    def stage_metrics(self, stage: str) -> list[str]:
        return self.metrics(self.stage_topologies[stage])

    def spec(self, topology: str, repeat) -> runspec.RunSpec:
        """One run's settings, built once per topology and repeat."""
        key = (topology, int(repeat))
        if key not in self._specs:
            self._specs[key] = build_spec(
                self.config, self.site, parse_topology(topology), int(repeat),
                topologies=list(self.topologies), measure=self.measure, throughput=self.throughput,
                accelerator=self.accelerator,
                local_threads=self.local_threads, data_file=self.data_file, lightning=self.lightning,
                layout=self.layout)
        return self._specs[key]

    def run_flags(self, topology: str, repeat, write: bool) -> str:
        """train.py's flags whose change reruns the run, inline or, past argsfile.INLINE_LIMIT, as
        their args file and digest (the shell's; run_settings is what Snakemake records); write:
        write the file (where jobs run, not in a dry run)."""
        return self._args_flags(self.layout.run_args(topology, repeat), self.spec(topology, repeat).argv(rerun=True),
                                write)

    def run_settings(self, topology: str, repeat) -> str:
        """What Snakemake records of the run's settings (RunSpec.recorded): its change reruns it."""
        return self.spec(topology, repeat).recorded()

    def log_flags(self, topology: str, repeat) -> str:
        """The flags that only choose what the log names: short, on the command line."""
        return self.spec(topology, repeat).command(rerun=False)

    @staticmethod
    def _args_flags(path: str, argv: list[str], write: bool) -> str:
        return shlex.join(argsfile.command(path, argv, write))

    def resources(self, topology: str) -> dict:
        """The SLURM plugin's resources of one topology's training job."""
        return slurm_resources(parse_topology(topology), self.site)

    def launch(self, topology: str) -> str:
        gpu_ids = list(self.gpu_ids) if self.gpu_ids is not None else None
        return launch_prefix(parse_topology(topology), self.site, self.python, gpu_ids)

    def run_identity(self) -> str:
        """What defines a run beyond its flags: the generated data's settings (the data is an
        ancient() input, so its settings must rerun a run) and torch's and Lightning's versions."""
        dataset = self.config["dataset"] if self.generated else None
        return json.dumps({"dataset": dataset, "versions": self.versions}, sort_keys=True)

    def prepare_flags(self) -> str:
        dataset = self.config["dataset"]
        return (
            f"--samples {dataset['samples']} --noise {dataset['noise']} --seed {dataset['seed']} "
            f"--split {' '.join(map(str, dataset['split']))} --out {self.generator_file} "
            f"--manifest {manifest_path_for(self.generator_file)}"
        )

    def time_limits(self, runtimes: dict) -> list[timelimit.Limit]:
        """Each stage's time limit and why (ddpscale.plan.cost.timelimit); runtimes: the profile's,
        {train_<stage>: minutes or None}. None locally: the local profile has no time limit."""
        if self.site.is_local:
            return []
        return timelimit.stage_limits(self.measure, self.throughput, self.stage_topologies, runtimes,
                                      self.measured_setup_s)

    def job_runtimes(self, runtimes: dict) -> dict:
        """{train_<stage>: the time limit its jobs get}: the profile's, or in throughput mode sized."""
        return {**runtimes, **{limit.rule: limit.minutes for limit in self.time_limits(runtimes)}}

    def training_jobs(self, runtimes: dict, decide=None, repeats=None) -> list[reservation.Job]:
        """One reservation.Job per run; runtimes: {train_<stage>: minutes or None}; decide:
        reservation.training_jobs'."""
        chosen = list(self.repeats) if repeats is None else repeats
        return reservation.training_jobs(self.stage_topologies, chosen, self.site, runtimes, decide)

    def reservation_lines(self, runtimes: dict, decided: dict | None = None) -> list[str]:
        """Each stage's time limit and what the benchmark reserves under it, printed by a dry run
        before anything is submitted; runtimes: the profile's. decided: {(topology, repeat):
        reservation.Decision} as Snakemake's DAG has it, a run missing from it not scheduled by
        this invocation; None: by the records on disk alone (a run runs where it has none)."""
        def decide(topology: str, repeat: int) -> reservation.Decision:
            finished = self.finished(topology, repeat)
            if decided is None:
                return reservation.by_record(finished)
            return decided.get((topology, repeat), reservation.Decision(finished, False, reservation.NOT_SCHEDULED))

        jobs = self.training_jobs(self.job_runtimes(runtimes), decide)
        return timelimit.limit_lines(self.time_limits(runtimes)) + reservation.summary_lines(
            jobs, self.site, self.accelerator, self.measure, self.throughput)

    def report_argv(self, runtimes: dict) -> list[str]:
        """The report's settings as explicit flags (its inputs come separately), each value in
        --flag=value form, so one that begins with "-" (a metric named -neg_loss, a negative
        target) is never read as a flag."""
        config = self.config
        flags = {
            "--baseline": parse_topology(config["baseline"]).name,
            "--accuracy-metric": config["accuracy"]["metric"],
            "--accuracy-mode": config["accuracy"]["mode"],
            "--accuracy-tolerance": config["accuracy"]["tolerance"],
            "--efficiency-threshold": config["report"]["efficiency_threshold"],
            "--repeats": len(self.repeats),
            "--log-dir": self.layout.train_logs,
            # what the report says it measured, beside what the runs recorded
            "--experiment": self.experiment,
            "--config-files": self.config_source,
            "--dataset": json.dumps(config["dataset"], sort_keys=True),
            "--data-args": json.dumps(config["data"]["init_args"], sort_keys=True),
        }
        if config["accuracy"]["target"] is not None:
            flags["--accuracy-target"] = config["accuracy"]["target"]
        if config["report"]["compare_with"]:
            flags["--compare"] = config["report"]["compare_with"]
        # the job time limit a full training of each topology would run under (cluster profiles)
        limits = reservation.job_limits(self.training_jobs(runtimes, repeats=[0]), self.site)
        if limits:
            flags["--job-limits"] = json.dumps(limits, sort_keys=True)
        # topology names are digits and an x: never read as a flag
        return [f"{flag}={value}" for flag, value in flags.items()] + ["--expected", *self.topology_names]

    def report_flags(self, runtimes: dict, write: bool, metrics: list[str] | None = None,
                     rule: str = "report_scaling") -> str:
        """The report's settings and the records it reads (metrics), inline or, past
        argsfile.INLINE_LIMIT, as the rule's args file and digest (a Snakemake param): the data
        module's init arguments, or the paths of thousands of runs, may be longer than a command
        line can be."""
        argv = self.report_argv(runtimes) + (["--metrics", *metrics] if metrics else [])
        return self._args_flags(self.layout.report_args(rule), argv, write)

    def record(self) -> dict:
        """What the workflow planned, for `make status`, which sees neither the site nor the
        command line (plan.json, ddpscale.plan.planfile)."""
        return planfile.written(self.experiment, self.measure, parse_topology(self.config["baseline"]).name,
                                self.stage_topologies, len(self.repeats))


def build_spec(config: dict, site: Site, topo: Topology, repeat: int, *, topologies: list[Topology], measure: str,
               throughput: Rule, accelerator: str, local_threads: int | None, data_file: str | None, lightning,
               layout: Layout) -> runspec.RunSpec:
    """One run's spec from the checked config, the site, the topology and the repeat, with what
    the workflow resolved once for all runs: the measure mode, the stopping rule (config
    throughput:), the host's accelerator and
    threads (local profile), the generated data file and a LightningCLI config's parts."""
    baseline = parse_topology(config["baseline"])
    # The first repeat probes its topology before training, in the same allocation; the
    # baseline's probe also times its compute at every topology's per-device batch, where the
    # prediction of each topology starts.
    probe_sizes = sorted({batch_per_device(config["batch"]["scaling"], config["batch"]["size"], t) for t in topologies})
    if measure != "throughput":  # full mode times the same windows but never stops on them: no caps,
        # so a cap's change reruns no full-mode run
        throughput = replace(throughput, max_steps=None, max_minutes=None)
    return runspec.RunSpec(
        topology=topo.name, num_nodes=topo.num_nodes, devices_per_node=topo.devices_per_node,
        model_class=config["model"]["class_path"], model_args=config["model"]["init_args"],
        data_class=config["data"]["class_path"], data_args=config["data"]["init_args"],
        data_file=data_file, data_files=list(config["data"]["files"]),
        scaling=config["batch"]["scaling"], batch_size=config["batch"]["size"], batch_dim=config["batch"]["dim"],
        max_epochs=config["max_epochs"], warmup_epochs=config["warmup_epochs"], repeat=repeat, seed=config["seed"],
        accelerator=run_accelerator(accelerator, site), cluster_env=cluster_env(topo, site),
        precision=config["precision"], compile=config["compile"],
        accumulate_grad_batches=config["accumulate_grad_batches"], loader=dict(config["dataloader"]),
        ddp=config["ddp"],  # completed and checked by RunSpec
        trainer_args=dict(lightning.trainer_args) if lightning else {},
        optimizers=dict(lightning.optimizers) if lightning else {},
        loggers=lightning.loggers if lightning else None,
        measure=measure, throughput=throughput,
        metrics=layout.metrics(topo.name, repeat), ckpt_dir=layout.checkpoint_dir(topo.name, repeat),
        # Locally one simulated device is one core (a 1-device run must not get every core, or
        # adding devices would add no hardware) and a GPU its share of the cores (hostdevices)
        threads=local_threads if site.is_local else site.cpus_per_gpu,
        collective_timeout_s=float(config["collective_timeout_s"]),
        compile_timeout_s=float(config["compile_timeout_s"]),
        probe=repeat == 0, probe_batch_sizes=probe_sizes if repeat == 0 and topo == baseline else [],
        # a cluster job holds its devices from the job's start, whatever ran before train.py
        held_from_job=not site.is_local,
        held_devices=site.held_devices(topo.num_nodes, topo.world_size) if site.whole_nodes else None,
        site_interconnect=site.interconnect,
        accuracy_metric=config["accuracy"]["metric"],
        epoch_metric=measuremode.epoch_metric(config["accuracy"]["metric"], config["accuracy"]["epoch_metric"]),
    )


def build(config: dict, site: Site, *, config_source: str, lightning, python: str, versions: dict,
          gpus=None, cores: int | None = None, memory_mb: int | None = None,
          source: Callable[[tuple], str] | None = None, measured_setup_s: dict | None = None) -> RunPlan:
    """The plan from the checked config and the site; gpus (hostdevices.VisibleGpus), cores and
    memory_mb are this host's, read by the caller only for the local profile. source names the
    file that set a config key (config.source.key_source), for the first words of a message;
    measured_setup_s what this experiment's finished records measured (timelimit.measured_setups),
    for throughput mode's limits.

    Raises TopologyError for a topology the site cannot run, AcceleratorError for a local
    accelerator this host does not have, each with one line naming the key and the fix.
    """
    source = source or (lambda key: config_source)
    topologies = check_topologies(config["topologies"], config["baseline"], site.gpus_per_node,
                                  config["batch"]["scaling"], config["batch"]["size"],
                                  config_path=source(("topologies",)), baseline_path=source(("baseline",)),
                                  multi_node_whole_nodes=site.multi_node_whole_nodes)
    fit = throughputfit.judge(config, topologies, dict(lightning.trainer_args) if lightning else {})
    measure, why = measuremode.resolve(config["measure"], site.is_local, fit.cannot_win)
    notes = [f"measure {measure} ({why})"]
    # said wherever throughput mode was asked for, by name or by auto on a cluster
    if (config["measure"] == measuremode.THROUGHPUT or config["measure"] == "auto" and not site.is_local) and (
            line := fit.line(config["measure"])):
        notes.append(line)
    accelerator, gpu_ids, threads = config["accelerator"], None, None
    if site.is_local:
        # simulated nodes share this host: auto is the GPU only when every topology's M x N
        # ranks get one each; a cluster's GPUs come from the allocation (runspec asks for them)
        decision = choose_accelerator(config["accelerator"], topologies, gpus.count, cores, source=gpus.source,
                                      where=source(("accelerator",)))
        accelerator, threads = decision.accelerator, decision.threads
        # refused, not warned: no wait makes these fit (a GPU rank's memory is its GPU's)
        if accelerator == "cpu" and memory_mb is not None and (too_big := unholdable(topologies, memory_mb)):
            raise TopologyError(unholdable_message(too_big[-1], memory_mb, source(("topologies",))))
        gpu_ids = tuple(gpus.ids) if accelerator == "gpu" else None
        if decision.note:
            notes.append(decision.note)
        if decision.oversubscribed:
            notes.append(f"warning: {oversubscription_warning(decision.oversubscribed, cores)}")
    return RunPlan(
        config=config, config_source=config_source, site=site, measure=measure,
        throughput=Rule.of(config["throughput"]),
        topologies=tuple(topologies), repeats=tuple(range(measuremode.repeats(config["repeats"], measure))),
        accelerator=accelerator, gpu_ids=gpu_ids, local_threads=threads, lightning=lightning,
        python=python, versions=versions, notes=tuple(notes), measured_setup_s=dict(measured_setup_s or {}))


def set_aside_unreadable(plan: RunPlan) -> list[str]:
    """Set aside each run record that core/record refuses (unreadable, cut short, of another
    shape or schema version, not a file, another run's) as metrics.json.unreadable, and say so
    in one line each.

    Snakemake reruns a job only when its output is missing or older than an input: a damaged
    record would otherwise stand for a finished run forever. Renamed, not deleted, so whatever
    is left of it can still be read; a dry run does it too, as it changes no result. One that
    cannot be renamed (a read-only folder) stays, and disk_problems refuses to go on.
    """
    lines = []
    for path in sorted(Path().glob(plan.layout.metrics("*", "*"))):
        _, why = run_record.load(path)
        if why is None:
            continue
        try:
            aside = set_aside(path, ".unreadable")
        except OSError:
            continue
        lines.append(f"{path} is unreadable ({why}); set aside as {aside.name}: this run will rerun")
    return lines


def finished_records(plan_layout: Layout) -> list[dict]:
    """Every run record of this experiment that core/record accepts (the others are set aside)."""
    found = (run_record.load(path)[0] for path in sorted(Path().glob(plan_layout.metrics("*", "*"))))
    return [record for record in found if record is not None]


def disk_problems(plan: RunPlan, source, set_aside_here: bool = True) -> list[str]:
    """What on disk stops the workflow before any job, each in one line with its fix; source(key)
    names the file that set a config key. Checked after the module contract, so a misspelt class
    path is named as that, not as a clash with finished runs.

    - Finished runs of another model or data module in this experiment's folder: Snakemake would
      delete them to rerun; the experiment's name is what keeps two workloads apart.
    - The generated dataset that finished runs used is missing or corrupt: Snakemake would
      regenerate it and rerun (first deleting) every finished run, but the data is reproducible
      byte for byte, so regenerating it outside Snakemake keeps them.
    - report.compare_with that is not a file, or not a scaling.tsv (its header).
    - A run record core/record refuses that set_aside_unreadable could not rename, where it ran
      (set_aside_here: a cluster job's own parse leaves other runs' records to the snakemake that
      scheduled it, which has refused them already).
    """
    problems = []
    records = {}
    for path in sorted(Path().glob(plan.layout.metrics("*", "*"))):
        found, why = run_record.load(path)
        if found is not None:
            records[str(path)] = found
        elif why is not None and set_aside_here:
            # set_aside_unreadable could not rename it: Snakemake would take it for a finished run
            problems.append(
                f"{path} is unreadable ({why}) and could not be set aside as {path.name}.unreadable (its folder "
                f"is not writable): make {path.parent} writable (chmod u+w), or move the file out of results/, "
                "and run again: that run then retrains")
    config = plan.config
    clash = other_workload(records, config["model"]["class_path"], config["data"]["class_path"])
    if clash:
        problems.append(
            f"{plan.config_source}: {clash}; set `experiment:` to a new name for this workload (its results go "
            f"to results/<name>/), or delete {plan.layout.runs} to replace the runs there")
    if plan.generated:
        data_file = Path(plan.data_file)
        finished = plan.finished_metrics()
        problem = None
        if data_file.exists():
            problem = corruption(str(data_file))
        elif finished:
            problem = f"data file {data_file} is missing but {len(finished)} finished run(s) used it"
        if problem:
            problems.append(
                f"{problem.split('; ')[0]}. To regenerate the same bytes and keep finished runs: "
                f"rm -rf {data_file.parent} && {plan.python} scripts/prepare_data.py {plan.prepare_flags()}")
    compare = config["report"]["compare_with"]
    fix = (f"point it at a scaling.tsv from an earlier run (copy {plan.layout.report}/scaling.tsv before "
           "rerunning) or set it to null")
    if compare and not Path(compare).is_file():
        problems.append(f"{source(('report', 'compare_with'))}: report.compare_with is {compare!r}, which is not "
                        f"a file; {fix}")
    elif compare and (found := earliertable.problem(compare)):
        problems.append(f"{source(('report', 'compare_with'))}: report.compare_with: {found}; {fix}")
    return problems
