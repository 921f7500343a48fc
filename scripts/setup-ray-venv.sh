#!/usr/bin/env bash
# Installs ray==2.53.0 from PyPI into target/ray-venv (reused when present).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/ray-venv
if [ -x "$venv/bin/ray" ] && "$venv/bin/python" -c 'import ray, sys; sys.exit(ray.__version__ != "2.53.0")' 2>/dev/null; then
  exit 0
fi
mkdir -p target
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check 'ray[default]==2.53.0'
"$venv/bin/ray" --version
