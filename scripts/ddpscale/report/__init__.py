"""Report: metrics -> scaling table, time breakdown, verdict, figures and report.html.

Pure pandas and matplotlib (no torch), so the report runs and is tested anywhere.
"""
