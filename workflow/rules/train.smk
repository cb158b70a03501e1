# The three training stages: the baseline topology, then 1 x N (one node), then M x N (several
# nodes). One rule definition, three names: the stages differ only in which topologies they
# take (wildcard constraints from config) and in the resources a profile may set for each by
# rule name (set-resources: train_baseline / train_single_node / train_multi_node). Site facts
# and resources every stage shares stay under set-resources `train` (docs/clusters.md).
#
# One job per topology and repeat. The first repeat probes its topology (step breakdown,
# all-reduce) inside the same allocation before training: one submission per topology and
# repeat, and the prediction measures the nodes that trained. Checkpoints live outside the
# outputs, so a failed or timed-out run resumes from its last checkpoint when run again.
# Helpers: common.smk.
#
# The stages are independent jobs: on a cluster they queue at the same time (a multi-node job
# need not wait for the baseline to finish); the local profile, one run at a time, trains
# them in stage order (priority).
rule train_baseline:
    input:
        script="scripts/train.py",
        data=get_train_data,
    output:
        metrics=report(
            PLAN.layout.metrics("{topology}", "{repeat}"),
            caption="../report/run.rst",
            category="Runs",
            labels={"topology": "{topology}", "repeat": "{repeat}"},
        ),
    log:
        PLAN.layout.train_log("{topology}", "{repeat}"),
    wildcard_constraints:
        topology=PLAN.stage_pattern("baseline"),
    priority: 3
    resources:
        **TRAINING_RESOURCES,
        # a retry may find the run already finished (killed while exiting): see train.py
        attempt=get_attempt,
        # The local profile allows one at a time, so runs never share the CPU they measure.
        train_slots=1,
    params:
        launch=get_launch,
        # the run's settings (ddpscale.run.runspec): for the shell, inline or as their args file and
        # digest (unrecorded); as Snakemake records them, so that a change reruns the job
        flags=get_run_flags,
        settings=get_run_settings,
        # not on the command line: its change alone reruns the job (dataset settings, versions)
        identity=get_run_identity,
        # what the log names: a change reruns nothing
        log_flags=get_log_flags,
    shell:
        "{params.launch} {input.script} {params.flags} {params.log_flags} --attempt {resources.attempt} > {log} 2>&1"


use rule train_baseline as train_single_node with:
    wildcard_constraints:
        topology=PLAN.stage_pattern("single_node"),
    priority: 2


use rule train_baseline as train_multi_node with:
    wildcard_constraints:
        topology=PLAN.stage_pattern("multi_node"),
    priority: 1


# In throughput mode a job's time limit is sized from the caps (common.smk): set after the rules,
# over the profile's stage entries, which Snakemake applies to each rule as it is defined.
set_time_limits()
