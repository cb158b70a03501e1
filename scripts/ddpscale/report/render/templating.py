"""The report's Jinja2 environment: markup lives in templates/, and every value is escaped.

autoescape is on for every template, so a host, model or file name (not ours to trust) can
only ever be text; a value that is meant as markup says so by being markupsafe.Markup, built
with Markup(...).format(...), which escapes its arguments. StrictUndefined makes a misspelt
name in a template an error instead of an empty cell.
"""
from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

ENV = Environment(loader=FileSystemLoader(Path(__file__).with_name("templates")), autoescape=True,
                  undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def render(name: str, **values) -> Markup:
    """Template `name` filled with values; Markup, so it can go into another template as is."""
    return Markup(ENV.get_template(name).render(**values))
