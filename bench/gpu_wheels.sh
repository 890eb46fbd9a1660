#!/usr/bin/env bash
# bench/gpu_wheels.sh DIR [--python-version X.Y] [--platform TAG]...: download, on a machine with network, the
# wheels that bench/gpu_check.sh installs on a GPU machine that has none (see that script's header):
#
#   bash bench/gpu_wheels.sh .whl --python-version 3.12 --platform manylinux_2_28_x86_64 \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
#   # carry .whl and the checkout there, then: bash bench/gpu_check.sh --wheels .whl
#
# `pip download --no-deps --only-binary=:all:` of a pinned list (the versions this project was tested with);
# antlr4-python3-runtime 4.9.3 has no wheel on PyPI, so it is built with `pip wheel --no-deps` (pure Python, one
# py3-none-any wheel fits every machine). Give the GPU machine's Python version and platform tags when they are
# not this machine's: pyarrow, pandas, xxhash, multiprocess, matplotlib, contourpy, kiwisolver and pillow ship
# per-version/per-platform wheels. PYTHON picks the pip to use (default python3).
set -euo pipefail

DIR=${1:?usage: bash bench/gpu_wheels.sh DIR [--python-version X.Y] [--platform TAG]...}
shift
TARGET=()
while (($#)); do
  case $1 in
    --python-version | --platform) TARGET+=("$1" "${2:?$1 needs a value}"); shift ;;
    *) echo "gpu_wheels.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
PYTHON=${PYTHON:-python3}

# part 1, train.py: Hydra
HYDRA=(hydra-core==1.3.8 omegaconf==2.3.1)
# part 1, the Goodhart plot of held-out early stopping
PLOT=(matplotlib==3.11.2 contourpy==1.3.3 cycler==0.12.1 fonttools==4.68.0 kiwisolver==1.5.1 pillow==13.0.0
      pyparsing==3.3.3 python-dateutil==4.0.0 tzdata==2026.6)
# part 2, the TRL comparison: trl and the datasets it imports
TRL=(trl==1.12.0 datasets==5.2.0 pyarrow==26.0.1 pandas==3.1.1 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0)

mkdir -p "$DIR"
"$PYTHON" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: ${TARGET[@]+"${TARGET[@]}"} \
  -d "$DIR" "${HYDRA[@]}" "${PLOT[@]}" "${TRL[@]}"
"$PYTHON" -m pip wheel --disable-pip-version-check --no-deps -w "$DIR" antlr4-python3-runtime==4.9.3
echo "wheels in $DIR:"
ls -1 "$DIR"/*.whl
