"""A package, as every folder of tests/unit is, so that a module here may share its name with
one there: pytest imports them as workflow.test_flops and unit.job.device.test_flops
(tests/unit/__init__.py)."""
