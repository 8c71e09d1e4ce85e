#!/usr/bin/env bash
# The separately installable packages of this repository, one directory per line.
#
# Every one has the same shape: a directory named after its import package that holds
# pyproject.toml, the package, README.md and tests/. Where it sits says what it is:
#   plugins/<package>/      runtimes and libraries      installed (editable) into .venv by scripts/setup.sh
#   reef_recipe_<name>/     recipes                     installed (editable) into .venv by scripts/setup.sh
#   examples/<package>/     the third-party example     never installed into .venv: its `reef` entry point
#                           would load into every Reef the tests start (tests/test_plugins.py installs
#                           it into a separate target; its own tests import it from the source tree)
# A directory without a pyproject.toml is not a package. pyproject.toml's [tool.pytest.ini_options]
# testpaths and [tool.ruff] src name the same globs; tests/test_package_shape.py holds them together.
#
# Usage: scripts/packages.sh [--installed | --examples | --all]   (default: --all)
set -euo pipefail
cd "$(dirname "$0")/.."

INSTALLED_GLOBS=(plugins/*/ reef_recipe_*/)
EXAMPLE_GLOBS=(examples/*/)

case "${1:---all}" in
  --installed) globs=("${INSTALLED_GLOBS[@]}") ;;
  --examples) globs=("${EXAMPLE_GLOBS[@]}") ;;
  --all) globs=("${INSTALLED_GLOBS[@]}" "${EXAMPLE_GLOBS[@]}") ;;
  *) echo "packages.sh: unknown option $1 (use --installed, --examples or --all)" >&2; exit 2 ;;
esac

for dir in "${globs[@]}"; do
  # an unmatched glob stays literal and has no pyproject.toml
  [ -f "$dir/pyproject.toml" ] && echo "${dir%/}"
done
exit 0
