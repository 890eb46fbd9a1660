#!/usr/bin/env bash
# bench/gpu_check.sh: the project's GPU check, one command, under 8 minutes on one GPU (an H200).
#
#   bash bench/gpu_check.sh [--wheels DIR] [--out DIR]      # on the GPU machine, from a checkout of lrlhf
#   bash bench/gpu_check.sh --dry-run [--out DIR]           # the same code path on CPU at a tiny shape
#
# Parts, one after the other, each under `timeout` (limits below; a part that fails or times out is reported
# in the block and the script exits 1 at the end, after the others ran):
#   1. the README's main command on the GPU trainer, end to end (toy world, SFT, RM, PPO, held-out gold):
#        python train.py recipe=ppo_lora trainer=gpu logger=csv hydra.run.dir=<tmp>/e2e
#      (an empty LRLHF_CACHE_DIR, so every stage is built); figures from its summary.json, and its wall time;
#   2. one PPO iteration, lrlhf PPOModule vs TRL 1.12 PPOTrainer, alternating, at the Qwen2.5-0.5B shape
#      (hidden 896, 24 layers, 14/2 heads, intermediate 4864, vocab 32000, tied; random weights), 64 prompts,
#      128 new tokens, bf16-mixed on both sides:
#        python bench/compare_trl.py --device cuda --shape qwen05 --precision bf16-mixed --batch 64 --new 128 ...
#   3. the rollout sampling throughput of our sampler (PPOModule.sample) at that shape, eager and compiled:
#        python bench/compare_trl.py --sampling --device cuda --shape qwen05 --precision bf16-mixed ...
#   4. (with what is left of the budget; not run is not a failure) the same sampler on the policy merged into a
#      copy in the run's dtype (module/engine=merged): ... --sampling --decoding eager --engine merged ...
#   5. (likewise optional) one PPO iteration at the Llama-3.1-8B shape, random bf16 weights built on the GPU,
#      LoRA policy and value adapters: fits or not, peak memory, time per phase:
#        python bench/ppo_at_scale.py --device cuda --shape llama8b --batch 16 --new 64
# It ends with a Markdown block for bench/RESULTS.md (date, GPU, driver, versions, every figure with the
# command that produced it), also written to <out>/block.md with every part's log.
#
# What the GPU machine needs. Installed there: a CUDA PyTorch, transformers, peft, lightning, torchmetrics
# (and what they pull in: accelerate, numpy, huggingface-hub, tokenizers, safetensors, jinja2, fsspec, ...).
# Nothing is downloaded there (HF_HUB_OFFLINE=1, WANDB_MODE=disabled, LRLHF_CACHE_DIR=<tmp>/cache). What travels:
#   - this checkout (the lrlhf project runs from it: PYTHONPATH=src:bench; no wheel, no install);
#   - a folder of wheels, passed with --wheels DIR (or WHEELS=DIR), installed with
#       pip install --no-index --no-deps --target <tmp>/site-packages
#     and put on PYTHONPATH (named site-packages on purpose: dill, with which datasets fingerprints, pickles a
#     module by value when its file lies neither under sys.prefix nor in a `site-packages` folder, and fails
#     on pyarrow's types); a wheel whose distribution is already installed there is skipped:
#       part 1: hydra-core, omegaconf, antlr4-python3-runtime (4.9.3: built as a wheel, PyPI has an sdist only);
#               matplotlib, contourpy, cycler, fonttools, kiwisolver, pillow, pyparsing, python-dateutil, tzdata
#               for the Goodhart plot (without matplotlib the plot is switched off, and the block says so);
#       part 2: trl (1.12.0), datasets, pyarrow, pandas, dill, multiprocess, xxhash (+ python-dateutil, tzdata);
#               without trl the part fails, saying so;
#       part 3: nothing more.
#     `bash bench/gpu_wheels.sh DIR [--python-version 3.12] [--platform manylinux_2_28_x86_64]` downloads them
#     (pip download --no-deps, versions pinned to the ones tested) on a machine with network; pass the GPU
#     machine's Python version and platform when they differ from that machine's.
#
# Environment knobs: PYTHON (default python3; --dry-run: the checkout's .venv/bin/python when there),
# GPU_CHECK_BUDGET_S (460: the script's total; each part's limit is cut to what is left of it after keeping
# 150 s for part 2 and 80 s for part 3), E2E_TIMEOUT_S (240), CMP_TIMEOUT_S (210), SMP_TIMEOUT_S (120),
# KEEP_TMP=1 (keep <tmp>: the run folder of part 1, the installed wheels).
set -euo pipefail

DRY=0
WHEELS=${WHEELS:-}
LOGS=""
while (($#)); do
  case $1 in
    --dry-run) DRY=1 ;;
    --wheels) WHEELS=${2:?--wheels needs a folder}; shift ;;
    --wheels=*) WHEELS=${1#--wheels=} ;;
    --out) LOGS=${2:?--out needs a folder}; shift ;;
    --out=*) LOGS=${1#--out=} ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [[ -n $WHEELS ]]; then
  if ! compgen -G "$WHEELS/*.whl" > /dev/null; then
    echo "gpu_check.sh: no *.whl in $WHEELS (bench/gpu_wheels.sh DIR downloads them)" >&2
    exit 2
  fi
  WHEELS=$(cd "$WHEELS" && pwd)  # the paths given are the caller's, before the cd below
fi
if [[ -n $LOGS ]]; then mkdir -p "$LOGS" && LOGS=$(cd "$LOGS" && pwd); fi
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
if [[ -z ${PYTHON:-} ]]; then
  PYTHON=python3
  if ((DRY)) && [[ -x $REPO/.venv/bin/python ]]; then PYTHON=$REPO/.venv/bin/python; fi
fi
T=$(mktemp -d "${TMPDIR:-/tmp}/lrlhf-gpu-check.XXXXXX")
LOGS=${LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/lrlhf-gpu-check-logs.XXXXXX")}
if [[ ${KEEP_TMP:-0} != 1 ]]; then trap 'rm -rf "$T"' EXIT; fi
BUDGET=${GPU_CHECK_BUDGET_S:-460}
SECONDS=0
FAILED=0
echo "gpu_check: $( ((DRY)) && echo 'DRY RUN on CPU (tiny shape)' || echo 'GPU run'); python $PYTHON; logs $LOGS; tmp $T"

# ------------------------------------------------------------------------------------------ environment
SITE=""
if [[ -n $WHEELS ]]; then
  mapfile -t TO_INSTALL < <("$PYTHON" "$REPO/bench/gpu_check.py" wheels "$WHEELS")
  if ((${#TO_INSTALL[@]})); then
    if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
        --target "$T/site-packages" "${TO_INSTALL[@]}" > "$LOGS/wheels.log" 2>&1; then
      SITE=$T/site-packages
      echo "wheels: ${#TO_INSTALL[@]} of $(compgen -G "$WHEELS/*.whl" | wc -l) installed from $WHEELS (the rest already there)"
    else
      echo "installing the wheels of $WHEELS failed (pip install --no-index --no-deps --target):" \
        "$(tail -2 "$LOGS/wheels.log")" | tee "$LOGS/setup.note"
      FAILED=1
    fi
  else
    echo "wheels: every distribution in $WHEELS is already installed"
  fi
elif ((!DRY)); then
  echo "no --wheels: using what $PYTHON already has"
fi
export PYTHONPATH="$REPO/src:$REPO/bench${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
  HF_DATASETS_CACHE=$T/hf-datasets WANDB_MODE=disabled LRLHF_CACHE_DIR=$T/cache MPLCONFIGDIR=$T/mpl \
  PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
"$PYTHON" "$REPO/bench/gpu_check.py" env "$LOGS/env.json" || echo "could not read the environment (see above)"

# ---------------------------------------------------------------------------------------------- parts
# run_part NAME LIMIT_S CMD...: CMD under `timeout`, its output in LOGS/NAME.log, its argv, exit code and wall
# time beside it; never stops the script.
run_part() {
  local name=$1 limit=$2 start=$SECONDS rc=0
  shift 2
  printf '%s\0' "$@" > "$LOGS/$name.argv"
  if ((limit < 20)); then
    echo "not run: less than 20 s left of the script's ${BUDGET} s budget" > "$LOGS/$name.log"
    rc=125
  else
    echo "== $name (limit ${limit} s): $*"
    timeout --kill-after=5 "$limit" "$@" > "$LOGS/$name.log" 2>&1 || rc=$?
  fi
  printf '{"rc": %d, "wall_s": %d, "timeout_s": %d}\n' "$rc" $((SECONDS - start)) "$limit" > "$LOGS/$name.status"
  echo "== $name: exit $rc after $((SECONDS - start)) s"
  if ((rc != 0)) && ! { [[ $name == merged || $name == scale ]] && ((rc == 125)); }; then  # 4, 5: time left
    FAILED=1
    tail -5 "$LOGS/$name.log" | sed 's/^/   | /'
  fi
}
min() { if (($1 < $2)); then echo "$1"; else echo "$2"; fi; }
left() { echo $((BUDGET - SECONDS)); }

if ((DRY)); then
  TRAINER=(trainer=cpu trainer.max_steps=8 'stage_overrides.sft=["trainer.max_steps=30"]'
           'stage_overrides.rm=["trainer.max_steps=30"]' eval.n_samples=1
           callbacks.early_stopping.every_n_rollouts=1 callbacks.checkpoint.every_n_rollouts=1)
  SHAPE=(--device cpu --shape tiny --precision bf16-mixed --batch 4 --new 8 --iters 2 --warmup 1 --threads 1)
  SCALE=(--device cpu --shape tiny --batch 4 --new 8 --iters 2 --threads 1)
else
  TRAINER=(trainer=gpu)
  SHAPE=(--device cuda --shape qwen05 --precision bf16-mixed --batch 64 --new 128 --iters 3 --warmup 1)
  SCALE=(--device cuda --shape llama8b --batch 16 --new 64 --iters 2)
fi
if ! "$PYTHON" -c "import matplotlib.backends.backend_agg" > /dev/null 2>&1; then
  TRAINER+=(callbacks.early_stopping.plot=false)
  echo "matplotlib is not importable: the Goodhart plot was switched off (callbacks.early_stopping.plot=false)" \
    | tee "$LOGS/e2e.note"
fi

# 1. the README main command on the GPU trainer
run_part e2e "$(min "${E2E_TIMEOUT_S:-240}" $(($(left) - 150 - 80)))" \
  "$PYTHON" train.py recipe=ppo_lora "${TRAINER[@]}" logger=csv "hydra.run.dir=$T/e2e"
cp "$T/e2e/summary.json" "$LOGS/e2e_summary.json" 2> /dev/null || true
cp "$T/e2e/logs/goodhart.png" "$LOGS/e2e_goodhart.png" 2> /dev/null || true
cp "$T/e2e/logs/metrics.csv" "$LOGS/e2e_metrics.csv" 2> /dev/null || true
grep -E "held-out gold utility|chosen PPO checkpoint" "$LOGS/e2e.log" | sed 's/^/   /' || true

# 2. one PPO iteration against TRL
run_part compare "$(min "${CMP_TIMEOUT_S:-210}" $(($(left) - 80)))" \
  "$PYTHON" bench/compare_trl.py "${SHAPE[@]}" --json "$LOGS/compare.json"
grep -E "^\| (lrlhf|TRL)|^ratio|^our phases|^our rollout" "$LOGS/compare.log" | sed 's/^/   /' || true

# 3. our sampler's throughput
run_part sampling "$(min "${SMP_TIMEOUT_S:-120}" $(($(left) - 5)))" \
  "$PYTHON" bench/compare_trl.py --sampling --decoding eager,compiled "${SHAPE[@]}" --json "$LOGS/sampling.json"
grep -E "^\| (eager|compiled)|x eager's speed per rollout" "$LOGS/sampling.log" | sed 's/^/   /' || true

# 4. the sampler on the policy merged into a bf16 copy (module/engine=merged), with what is left of the budget
run_part merged "$(min "${MRG_TIMEOUT_S:-90}" $(($(left) - 5)))" \
  "$PYTHON" bench/compare_trl.py --sampling --decoding eager --engine merged "${SHAPE[@]}" --json "$LOGS/merged.json"
grep -E "^\| eager" "$LOGS/merged.log" | sed 's/^/   /' || true

# 5. one PPO iteration at the Llama-3.1-8B shape in bf16 (fits or not, peak memory, phases), with what is left
run_part scale "$(min "${SCL_TIMEOUT_S:-150}" $(($(left) - 5)))" \
  "$PYTHON" bench/ppo_at_scale.py "${SCALE[@]}" --json "$LOGS/scale.json"
grep -E "one PPO iteration|does not fit" "$LOGS/scale.log" | sed 's/^/   /' || true

# ---------------------------------------------------------------------------------------------- block
REPORT=(report "$LOGS" "$T" --total-s "$SECONDS")
if ((DRY)); then REPORT+=(--dry-run); fi
echo
echo "----- 8< ----- for bench/RESULTS.md -----"
"$PYTHON" "$REPO/bench/gpu_check.py" "${REPORT[@]}" | tee "$LOGS/block.md" || FAILED=1
echo "----- >8 -----"
if ((FAILED)); then
  echo "gpu_check: some part failed (see the block and $LOGS)" >&2
  exit 1
fi
