"""A package, as tests/workflow is, so that a module here may share its name with one there
(tests/unit/test_flops.py holds the pure tests of what tests/workflow/test_flops.py runs for
real): pytest imports them as unit.test_flops and workflow.test_flops. A bare
`from test_flops import helper` finds this folder's first (pytest.ini's pythonpath)."""
