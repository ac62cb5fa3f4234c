#!/bin/sh
# The runtime install of dlrover-events: what the image's Dockerfile runs, and what
# tests/integration/deploy/test_image_install.py runs into a fresh venv, so the recipe
# the image is built from is the one the suite checks.
#
# Usage: install.sh SOURCE VENV
#   SOURCE  the repository's root (a copy of it: pip builds the wheel in place)
#   VENV    where the virtual environment goes (made here; the image uses
#           /opt/dlrover-events and puts its bin/ on PATH)
#
# The runtime only: no `dev` (tests, linters), no `torch` (training images add the SDK
# instead: `pip install ./sdk`, see deploy/README.md), no `embedded` extra (the embedded
# broker and Postgres of `make run`: a cluster has its own Kafka and Postgres) and no `sim`
# (numpy, scipy, matplotlib: the simulator and the A/B report only; numpy comes all the
# same, with Optuna, the searchers' samplers).
# pip reads its usual environment (PIP_INDEX_URL, PIP_NO_INDEX, PIP_FIND_LINKS,
# PIP_CONSTRAINT, ...), so a mirror, a wheelhouse or pinned versions need no change here.
set -eu

if [ "$#" -ne 2 ]; then
  echo "usage: $0 SOURCE VENV" >&2
  exit 2
fi
source_dir="$1"
venv="$2"
python="${PYTHON:-python3}"

"${python}" -m venv "${venv}"
# pip compiles every module as it installs it: a read-only root filesystem never needs a
# __pycache__ at run time.
# The full distribution depends on the SDK's (sdk/: the schemas and the modules a training
# pod shares with the services), which no index has: both from the source, in one resolve.
"${venv}/bin/python" -m pip install --no-cache-dir --disable-pip-version-check \
  "${source_dir}/sdk" "${source_dir}"
# The one entrypoint answers, and finds the services and commands of streams/ and
# handlers/ through its entry points (a broken install fails the build, not the pod).
"${venv}/bin/dlrover-events" --help >/dev/null
"${venv}/bin/dlrover-events" optimizers >/dev/null
echo "dlrover-events installed into ${venv}"
