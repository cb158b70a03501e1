"""The report as a reader sees it: report.html (html) with its tables (html_tables), the one-line
summaries of its sections (summaries) and its plots (plots), marked up by Jinja2 templates
(templating, templates/).
"""
