#!/usr/bin/env bash
# What every CI runner calls: `ci/run-session.sh <nox session>`. Fails when the session fails, including
# when pytest collects no test (nox treats pytest's exit code 5 as a failure like any other).
set -euo pipefail
session="${1:?usage: ci/run-session.sh <nox session name>}"
cd "$(dirname "$0")/.."
python -m pip install --quiet nox uv
python -m nox --non-interactive -s "$session"
