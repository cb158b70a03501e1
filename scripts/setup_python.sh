#!/usr/bin/env bash
# make setup's first step: is PYTHON one that snakemake 9 and its SLURM plugin accept (3.11+),
# with the venv module? If not, one line naming the fix, before anything is installed.
# apt only where it can work: as root, on a Debian/Ubuntu machine, for the system's own Python
# (a cluster login node is none of these; there the site's Python module is the fix).
set -uo pipefail
py=${1:?usage: setup_python.sh PYTHON}
fix="load your site's Python 3.11+ (module avail python, then e.g. module load python/3.11) or name one: make setup PYTHON=/path/to/python3.11"

die() { echo "make setup: $*" >&2; exit 1; }

path=$(command -v "$py") || die "no '$py' found; $fix"
version=$("$path" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) ||
  die "'$py' ($path) does not run as Python; $fix"
"$path" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null ||
  die "'$py' ($path) is Python $version; snakemake 9 and its SLURM plugin need 3.11 or newer: $fix"
"$path" -c 'import ensurepip, venv' 2>/dev/null && exit 0

# Debian's python3 lacks venv/ensurepip until python3.X-venv is installed.
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null && [[ $(readlink -f "$path") == /usr/bin/* ]]; then
  echo "make setup: installing python$version-venv (apt)"
  { apt-get update -qq && apt-get install -y -qq "python$version-venv"; } ||
    die "apt-get install python$version-venv failed"
  exit 0
fi
die "'$py' ($path, Python $version) has no venv module; install python$version-venv (root: apt-get install python$version-venv) or $fix"
