#!/usr/bin/env bash
# dnnperf's CUDA paths on a GPU machine, as one script: the CUDA tests, then the CLI's main jobs on the
# GPU (calibration, the demo's profile, memsave at the seed paper's size). Each step has its own time
# limit and log; a failed step does not stop the next. Everything lands in OUTDIR, and is also packed
# into OUTDIR/gpu-check.tgz after every step, so a run stopped at its limit keeps what it measured.
#
#   benchmarks/gpu_check.sh OUTDIR          # on the GPU machine, from the repository root
#
# DEADLINE (epoch seconds) shortens or skips the steps that would end after it, so that a call with a
# time limit gets back every step it started.
#
# Needs torch with CUDA and dnnperf's dependencies importable by $PYTHON (default python3); dnnperf
# itself is taken from src/ (no install). STEPS picks steps by name (default: all, in this order).
set -u
OUTDIR=${1:?usage: benchmarks/gpu_check.sh OUTDIR}
PYTHON=${PYTHON:-python3}
export DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-"env tests zoo-tests collectives buckets hw memsave-full profile memsave-small profile-full \
memsave-resnet50 profile-hf memsave-hf memsave-timm fsdp host hw-full predict heldout heldout-fresh heldout-third \
model"}
export WORK=$(mktemp -d /tmp/dnnperf-gpu-check.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 DNNPERF_RUNS_DIR=$WORK/runs DNNPERF_CACHE_DIR=$WORK/cache
mkdir -p "$OUTDIR" "$WORK/logs"
export PYTHON
dnnperf() { "$PYTHON" -m dnnperf "$@"; }

pack() {
    tar -C "$WORK" -czf "$OUTDIR/gpu-check.tgz.part" logs runs cache 2>/dev/null
    mv "$OUTDIR/gpu-check.tgz.part" "$OUTDIR/gpu-check.tgz"
}

step() {  # step NAME SECONDS COMMAND...: run it unless STEPS leaves it out; log, status, pack
    local name=$1 limit=$2 started
    shift 2
    [[ " $STEPS " == *" $name "* ]] || return 0
    started=$(date +%s)
    if [[ -n ${DEADLINE:-} ]]; then  # epoch seconds by which every step must have ended (and been packed)
        (( DEADLINE - started < 20 )) && { echo "rc=skipped $name (deadline)" | tee -a "$OUTDIR/summary.txt"; return 0; }
        (( limit > DEADLINE - started - 10 )) && limit=$((DEADLINE - started - 10))
    fi
    echo "== $(date -u +%T) $name (limit ${limit}s)"
    timeout -k 10 "$limit" bash -c '"$@"' _ "$@" >"$WORK/logs/$name.log" 2>&1  # functions too
    local rc=$?
    echo "rc=$rc ${name} $(($(date +%s) - started))s" | tee -a "$OUTDIR/summary.txt"
    tail -n 30 "$WORK/logs/$name.log"
    pack
}

environment() {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    "$PYTHON" -c "import torch, sys; print(sys.version); print(torch.__version__, torch.version.cuda, \
torch.cuda.get_device_name(0), torch.backends.cudnn.version())"
    nproc
    free -g
}

export -f dnnperf environment
TESTS=${TESTS:-"tests/test_cuda_paths.py \
    tests/test_stages.py::test_cuda_stage_boundaries_are_events_resolved_after_the_step \
    tests/test_layers.py::test_layers_on_cuda_are_timed_with_events_and_attributed \
    tests/test_hardware.py::test_quick_calibration_on_cuda \
    tests/test_memory_loop.py::test_what_follows_a_break_inside_the_block_is_not_the_tracked_steps \
    tests/test_model_memory.py::test_describing_a_users_model_leaves_its_training_where_it_was"}
step env 30 environment
# shellcheck disable=SC2086  # TESTS is a list of test ids
step tests 180 "$PYTHON" -m pytest -q -p no:cacheprovider -rA --timeout 60 $TESTS
# Third-party models: timm's (where the GPU host has timm and torchvision) and the planner's unit walk.
step zoo-tests 150 "$PYTHON" -m pytest -q -p no:cacheprovider -rA --timeout 90 tests/test_zoo.py \
    tests/test_memsave_planner.py::test_units_of_a_timm_vit_are_its_blocks
# gloo on this host's CPU cores, 2 ranks of one thread each: the collective microbenchmarks against the
# model (target: >= 64 KiB within 10%), three runs, and dp's bucket allreduces against stand-alone ones
# (target: within 20%). On a 2-core machine gloo's threads wait for a core; here they need not.
step collectives 120 bash -c 'rc=0; for run in 1 2 3; do dnnperf validate --collectives --no-report || rc=1; done; exit $rc'
step buckets 200 "$PYTHON" benchmarks/distributed_benchmarks.py --steps 30 \
    --output "$WORK/logs/benchmarks-distributed.md" --json "$WORK/logs/buckets.json"
step hw 90 dnnperf hw --device "$DEVICE" --quick
# Seed 003's experiment at its size: VGG-19, 224x224 images, batch 64 (target: -50% at <= 10%).
step memsave-full 200 dnnperf memsave vgg19 --preset full --budget "${MEMSAVE_BUDGET:-50%}" --device "$DEVICE" --steps 7
# The demo's profile, on the GPU: stages (on-disk data), layers and memory at three batch sizes.
step profile 150 dnnperf profile resnet18 --preset small --sweep 16,64,256 --steps 10 --warmup 3 \
    --data disk --layers --memory --device "$DEVICE"
# The CPU benchmark's configuration, for comparison with docs/benchmarks-memsave.md.
step memsave-small 150 dnnperf memsave vgg19 --preset small --budget 50% --device "$DEVICE" --steps 9
# A compute-bound profile (where per-layer CUDA events measure kernels, not launch gaps).
step profile-full 150 dnnperf profile resnet50 --preset full -b 64 --steps 10 --warmup 3 --layers --memory \
    --device "$DEVICE"
# The CPU criterion's workload at its published size (saved activations 2x smaller).
step memsave-resnet50 200 dnnperf memsave resnet50 --preset full --budget 60% --device "$DEVICE" --steps 5
# A third-party model on the GPU: stages, layers (categories from operators) and memory of transformers'
# GPT-2; the memory planner on it (blocks found inside transformer.h); FSDP on one NCCL rank.
step profile-hf 120 dnnperf profile hf:gpt2 --preset small -b 16 --steps 10 --warmup 3 --layers --memory \
    --device "$DEVICE"
step memsave-hf 150 dnnperf memsave hf:gpt2 --preset small -b 16 --budget 50% --device "$DEVICE" --steps 5
# timm's ViT (blocks inside `blocks`), where the GPU host has timm.
step memsave-timm 150 dnnperf memsave timm:vit_tiny_patch16_224 --preset small -b 32 --budget 50% \
    --device "$DEVICE" --steps 5
step fsdp 120 dnnperf profile gpt2 --preset small -b 8 --nproc 1 --strategy fsdp --steps 5 --warmup 2 \
    --memory --device "$DEVICE"
# The performance model on the GPU: the full calibration, then single-process step times of
# eight workloads at three batch sizes, host-bound to device-bound, predicted and measured.
# Where a host-bound GPU step's host time goes, against the model's host calibration (the model
# over-predicts host-bound GPU steps: docs/validation.md#single-process-on-a-gpu-step-time).
step host 120 "$PYTHON" benchmarks/host_costs.py --device "$DEVICE" --output "$WORK/logs/host_costs.json"
step hw-full 180 bash -c 'dnnperf hw --device "$DEVICE" &&
    cp "$(ls -t "$DNNPERF_CACHE_DIR"/hardware/*.json | head -n 1)" "$WORK/logs/hw-$DEVICE.json"'
step predict 120 dnnperf predict resnet50 --preset full -b 64 --machine hw --device "$DEVICE" --strategy single,fsdp \
    --sweep batch_size=32,64,128
# The held-out models (transformers', and timm's where installed) on the GPU, at 8x the CPU's batches.
step heldout 330 "$PYTHON" benchmarks/heldout_validation.py --profile "$WORK/logs/hw-$DEVICE.json" \
    --device "$DEVICE" --batch-scale 8 --predictions 2 ${HELDOUT_MODELS:+--models "$HELDOUT_MODELS"} --json "$WORK/logs/heldout-$DEVICE.json" \
    --markdown "$WORK/logs/heldout-$DEVICE.md"
# The second and third held-out sets (benchmarks/heldout_validation.py --fresh, --third), likewise.
step heldout-fresh 240 "$PYTHON" benchmarks/heldout_validation.py --profile "$WORK/logs/hw-$DEVICE.json" \
    --device "$DEVICE" --batch-scale 8 --predictions 2 --fresh --json "$WORK/logs/heldout-fresh-$DEVICE.json" \
    --markdown "$WORK/logs/heldout-fresh-$DEVICE.md"
step heldout-third 240 "$PYTHON" benchmarks/heldout_validation.py --profile "$WORK/logs/hw-$DEVICE.json" \
    --device "$DEVICE" --batch-scale 8 --predictions 2 --third --json "$WORK/logs/heldout-third-$DEVICE.json" \
    --markdown "$WORK/logs/heldout-third-$DEVICE.md"
step model 360 dnnperf validate ${MODEL_WORKLOADS:-resnet18 resnet50 vgg16 alexnet inception_v3 transformer gpt2 \
    seq2seq} --device "$DEVICE" --preset small --batch-sizes "${MODEL_BATCHES:-16,64,256}" --processes 1 --steps 10 \
    --json
