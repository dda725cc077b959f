#!/usr/bin/env bash
# benches/peers/run.sh: the side-by-side turn-cost benchmark, one command.
#
#   benches/peers/run.sh                  # every row (~12 min after the installs)
#   benches/peers/run.sh --quick          # smoke run, small N
#   benches/peers/run.sh --only cadre,adk # some rows (lgserver lgserver-pg langgraph agents autogen bare adk
#                                         # adk-sqlite adk-pg cadre-disk cadre-tmpfs cadre-pg;
#                                         # cadre = the three cadre rows, adk-server = adk-sqlite,adk-pg)
#
# Needs: python3 (3.10+, with venv; 3.11+ for lgserver-pg), cargo, PyPI and
# crates.io once; for the database rows PostgreSQL's server binaries
# (Debian: postgresql) and redis-server. It makes a venv per Python
# framework under target/peers/venvs (pinned requirements in
# benches/peers/requirements), builds cadre and the ADK-Rust programs in
# release mode into $CARGO_TARGET_DIR (default target/), starts one
# PostgreSQL and one Redis for the run under target/peers, and writes
# target/peers/report.md and report.json. A row that cannot be set up or
# run is reported as such; the others still run. See README.md here.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v python3 >/dev/null || { echo "benches/peers needs python3 (3.10 or later, with venv)" >&2; exit 2; }
python3 -c 'import sys, venv; sys.exit(sys.version_info < (3, 10))' ||
    { echo "benches/peers needs python3 3.10 or later with the venv module (Debian: apt-get install python3-venv)" >&2; exit 2; }
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
exec python3 "$here/peers.py" "$@"
