"""A job of the same run left live by an earlier snakemake (a dropped SSH session) stops the
next one before it submits a second job into the same checkpoint (plan.squeue.live_training_job)."""
from ddpscale.status.rows import Job
from ddpscale.plan.site.squeue import live_training_job

HERE = "/home/u/ddpscale"


def job(id_, state, comment="rule_train_single_node_wildcards_1x2_0", workdir=HERE):
    return Job(id_, state, "None", comment, workdir, 41.0)


def test_a_running_job_of_the_same_run_in_this_directory_is_named_with_the_fix():
    line = live_training_job([job("812", "RUNNING")], HERE, "1x2", 0)
    assert line == ("SLURM job 812 (RUNNING), submitted by an earlier snakemake, still trains 1x2 repeat 0 of "
                    "this directory; a second job would train into the same checkpoint. Wait for it to end "
                    "(make status) or scancel 812, then run snakemake again")
    assert "SLURM job 813 (PENDING)" in live_training_job([job("813", "PENDING")], HERE, "1x2", 0)


def test_other_runs_directories_and_ended_jobs_do_not_count():
    assert live_training_job([job("812", "RUNNING")], HERE, "1x2", 1) is None  # another repeat
    assert live_training_job([job("812", "RUNNING")], HERE, "2x1", 0) is None  # another topology
    assert live_training_job([job("812", "RUNNING", workdir="/home/u/other")], HERE, "1x2", 0) is None
    for state in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"):
        assert live_training_job([job("812", state)], HERE, "1x2", 0) is None
    assert live_training_job([job("9", "RUNNING", comment="rule_report")], HERE, "1x2", 0) is None
    assert live_training_job([], HERE, "1x2", 0) is None
