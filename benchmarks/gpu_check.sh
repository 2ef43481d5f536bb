#!/usr/bin/env bash
# The GPU paths, run on a GPU, in one go (issue: "The GPU paths, run on a GPU").
#
#   OUT=/some/folder benchmarks/gpu_check.sh            # every part
#   GPU_CHECK_PARTS="tests resume" benchmarks/gpu_check.sh   # some parts (a rerun)
#
# Parts, in order: env, tests (the CUDA tests that skip on the CPU), device-update (on-device
# steps against torch's fused CUDA SGD-momentum, Adam, AdamW on 100M parameters), resume (a GPU
# checkpoint resumed on the CPU and back, bit for bit), autocast (bf16 autocast with the
# offload optimizer), offload (benchmarks/offload.py: the host Adam step against DeepSpeed's
# CPU Adam, and the offloaded training step), singa (SINGA's GPU jobs: mnist and cifar10 with
# gpu, the cuDNN-named layers, a few hundred steps with their loss). The order puts the
# benchmark last: GPU_CHECK_DEADLINE (seconds, default 480) bounds the whole, and a part that
# would run past it gets what is left, or is skipped and counted as failed.
#
# Everything it prints and writes goes under $OUT (a temporary folder when unset): the log
# gpu_check.log, a summary.txt of every part's outcome, the parts' own outputs. Python
# packages the device image lacks are taken from .whl/ when it is there (wheels carried by the
# device tool). Without a GPU it says so and exits 0. Each part has a time limit (seconds,
# GPU_CHECK_LIMIT_<PART>), so that the whole fits one device call of 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
PY=${PYTHON:-python3}
PARTS=${GPU_CHECK_PARTS:-env tests device-update resume autocast singa offload}
START=$SECONDS
echo "gpu_check: $(date -u '+%F %T') UTC; parts: $PARTS; output in $OUT"

if ! command -v nvidia-smi >/dev/null 2>&1 \
        || ! $PY -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
            2>/dev/null; then
    echo "gpu_check: no GPU here (nvidia-smi missing or torch sees no CUDA device): nothing to"
    echo "check. Run it on a machine with an NVIDIA GPU and CUDA-enabled torch."
    exit 0
fi

# What the image lacks (tensorboardX, crc32c, shtab; DeepSpeed and its needs), from .whl/.
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/gpu-check-site .whl/*.whl && echo "installed from .whl: $(ls .whl | tr '\n' ' ')"
    export PYTHONPATH=/tmp/gpu-check-site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$OUT/numba-cache}
export CUBLAS_WORKSPACE_CONFIG=:4096:8  # deterministic cuBLAS: the resume part compares bits
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/gpu-check-inductor}

declare -A LIMIT=([env]=30 [tests]=180 [device-update]=120 [resume]=60 [autocast]=40
                  [singa]=90 [offload]=150)
DEADLINE=${GPU_CHECK_DEADLINE:-480}  # seconds for the whole check: parts late in line get less
: > "$OUT/summary.txt"
status=0

part() {  # part NAME COMMAND...: run one part under its limit, note its outcome
    local name=$1; shift
    case " $PARTS " in *" $name "*) ;; *) return 0 ;; esac
    local var="GPU_CHECK_LIMIT_${name//-/_}" limit
    limit=${!var:-${LIMIT[$name]}}
    local left=$((DEADLINE - (SECONDS - START) - 5))
    [ "$limit" -le "$left" ] || limit=$left
    if [ "$limit" -lt 15 ]; then
        echo "=== $name: skipped, $((SECONDS - START)) s of the ${DEADLINE} s spent ==="
        echo "$name: SKIPPED (no time left)" >> "$OUT/summary.txt"; status=1; return 0
    fi
    local t0=$SECONDS
    echo; echo "=== $name (limit ${limit} s, at $((SECONDS - START)) s) ==="
    timeout --kill-after=10 "$limit" bash -c '"$@"' part "$@"  # functions are exported
    local rc=$?
    local verdict="ok"
    [ $rc -eq 0 ] || { verdict="FAILED (exit $rc$([ $rc -eq 124 ] && echo ', time limit'))"; status=1; }
    echo "=== $name: $verdict in $((SECONDS - t0)) s ==="
    echo "$name: $verdict in $((SECONDS - t0)) s" >> "$OUT/summary.txt"
}

env_part() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    $PY - <<'EOF'
import os, platform, numba, numpy, torch
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"numba {numba.__version__}, numpy {numpy.__version__}, {os.cpu_count()} CPUs")
print(f"device: {torch.cuda.get_device_name()}, capability {torch.cuda.get_device_capability()}")
import paramserver, paramserver.torch
print(f"paramserver {paramserver.__version__} from {paramserver.__file__}")
EOF
}

singa_part() {
    local ws="$OUT/singa" rc=0
    mkdir -p "$ws"
    $PY -m paramserver data digits examples/mnist/train_data.bin --shape 28,28 || return 1
    $PY -m paramserver data digits examples/mnist/test_data.bin --shape 28,28 --split test || return 1
    $PY -m paramserver data digits examples/cifar10/train_data.bin --shape 3,32,32 \
        --mean examples/cifar10/image_mean.bin || return 1
    $PY -m paramserver data digits examples/cifar10/test_data.bin --shape 3,32,32 --split test \
        || return 1
    for job in mnist/conv.conf cifar10/cudnn.conf cifar10/cudnn_hybrid.conf; do
        local name=${job//\//-}
        echo "--- $job on GPU 0, 300 steps"
        $PY -m paramserver train "examples/singa/$job" --steps 300 --set gpu=0 --quiet \
            --no-tensorboard --workspace "$ws/${name%.conf}" || { rc=1; continue; }
        $PY - "$ws/${name%.conf}/metrics.csv" <<'EOF' || rc=1
import csv, math, sys
rows = list(csv.DictReader(open(sys.argv[1])))
train = [r for r in rows if r["phase"] == "train"]
test = [r for r in rows if r["phase"] == "test"]
print(f"    train loss {float(train[0]['loss']):.4f} (step {train[0]['step']}) -> "
      f"{float(train[-1]['loss']):.4f} (step {train[-1]['step']})"
      + (f"; test accuracy {float(test[-1]['accuracy']):.4f} at step {test[-1]['step']}"
         if test else ""))
# the training loss is finite at every report (a test phase without a loss layer, as
# cifar10/cudnn.conf's, reports accuracy only: its loss is not measured)
sys.exit(0 if train and all(math.isfinite(float(r["loss"])) for r in train) else 1)
EOF
    done
    return $rc
}

export -f env_part singa_part
export PY
part env env_part
part tests $PY -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py tests/test_torch_placement.py tests/test_torch_overlap.py
part device-update $PY benchmarks/gpu_check.py device-update --params 100 --steps 100
part resume $PY benchmarks/gpu_check.py resume
part autocast $PY benchmarks/gpu_check.py autocast
part singa singa_part
part offload $PY benchmarks/offload.py --params 100 --rounds 5

echo; echo "=== summary ($((SECONDS - START)) s) ==="; cat "$OUT/summary.txt"
exit $status
