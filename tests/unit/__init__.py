"""A package, as tests/workflow is, so that a module here may share its name with one there
(tests/unit/test_flops.py holds the pure tests of what tests/workflow/test_flops.py runs for
real): pytest imports them as unit.test_flops and workflow.test_flops. What test files share
is in tests/helpers, never imported from another test file."""
