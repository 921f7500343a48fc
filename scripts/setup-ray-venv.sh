#!/usr/bin/env bash
# Installs ray[default,serve]==2.53.0 from PyPI into target/ray-venv under
# Ray's own pinned dependency set (docker/ray/constraints-2.53.0.txt), the
# same set the node and engine images carry, then checks the result with
# docker/ray/check_deps.py (pip check, every pin, a Serve config round trip).
# Reused when present and installed from the same constraints file.
set -euo pipefail
cd "$(dirname "$0")/.."
RAY_VERSION=2.53.0
venv=target/ray-venv
constraints=docker/ray/constraints-$RAY_VERSION.txt
stamp=$venv/.argus-constraints.sha256
want=$(sha256sum "$constraints" | cut -d' ' -f1)
if [ -x "$venv/bin/ray" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
mkdir -p target
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check \
  -c "$constraints" "ray[default,serve]==$RAY_VERSION"
"$venv/bin/python" docker/ray/check_deps.py --ray "$RAY_VERSION" --constraints "$constraints"
echo "$want" >"$stamp"
