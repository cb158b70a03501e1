"""Report: metrics.json records -> tables (TSV), figures and report.html, pure pandas and matplotlib
(no torch), so it runs and is tested anywhere. Each step below imports only those under it: load/
(the runs read and checked), figures/ (what they measured, computed), verdict/ (which topology to
use, and where a number cannot mean what it seems), render/ (the page, its tables and plots);
reportdata.py computes everything once, fmt.py writes every number the same way.
"""
