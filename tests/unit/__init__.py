"""Unit tests, in folders that mirror scripts/ddpscale (tests/unit/job/device/ tests
ddpscale.job.device). Every folder is a package, as tests/workflow is, so a module here may share
its name with one there (tests/unit/job/device/test_flops.py holds the pure tests of what
tests/workflow/test_flops.py runs for real): pytest imports them as unit.job.device.test_flops and
workflow.test_flops. What test files share is in tests/helpers, never imported from another test
file."""
