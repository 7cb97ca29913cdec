#!/usr/bin/env bash
# Graphs built with ch_graph_*, and the same models exported by PyTorch to ONNX and imported, against PyTorch (graph_models.py / graph_models.c: a ResNet with
# downsample shortcuts, a MobileNet with depthwise convs, ReLU6 and squeeze-excitation, a DenseNet
# with concat and pools in ceil_mode, a net ending in log_softmax with view):
#   one SGD step from PyTorch's initial weights gives PyTorch's parameters and BatchNorm buffers
#   (within 1e-4), on one device, on two with sync-BN and on two MPI ranks with sync-BN; PyTorch
#   loads each result with load_state_dict(strict=True) and its eval accuracy is cohort's. The zoo's
#   models (lenet, mnist-cnn, mlp, linear, resnet18), built by cohort from their names, likewise.
# usage: graph_parity.sh GRAPH_PARITY DATA_ROOT [MPIRUN ARGS...]
# PARITY_DEVICE=cuda runs cohort's side on GPUs (cuda:0, and cuda:0,cuda:1 with COHORT_CUDA_WRAP=1
# on a machine with one), and adds resnet18 with sync-BN over a one-member NCCL communicator
# (COHORT_NCCL=1: the statistics and the start's broadcast through NCCL); PYTHON picks the
# interpreter that has PyTorch (a GPU machine's python3).
set -euo pipefail
bin=$1 data=$2; shift 2
py=${PYTHON:-/usr/bin/python3}
kind=${PARITY_DEVICE:-cpu}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$py" "$here/graph_parity.py" make "$data" "$tmp"

# Each run keeps its checkpoint under a name of its own and lists it; PyTorch loads them all at the
# end, in one process (strict loading and eval accuracy).
runs=0
run() { # label model command...
    local label=$1 model=$2; shift 2
    echo "== $model, $label"
    "$@" | tee "$tmp/out"
    local correct; correct=$(sed -n 's/^correct \([0-9]*\)$/\1/p' "$tmp/out")
    [ -n "$correct" ] || { echo "FAIL: $model ($label) printed no accuracy"; exit 1; }
    runs=$((runs + 1))
    mv "$tmp/$model.cohort.safetensors" "$tmp/run$runs.safetensors"
    echo "$model $tmp/run$runs.safetensors $correct $model, $label" >>"$tmp/runs"
}

# An imported graph runs over devices and ranks by the same code as a built one: past its one-device
# match, the imported form runs on two devices and two ranks for mobilenet only (the one with the
# most import logic: depthwise groups, ReLU6 as Clip, squeeze-excitation's broadcast Mul).
for m in resnet mobilenet densenet lognet headnet; do
    for form in "" onnx:; do
        run "${form}1 device" "$m" "$bin" step "$tmp" "$form$m" $kind:0
        [ -z "$form" ] || [ "$m" = mobilenet ] || continue
        run "${form}2 devices, sync-BN" "$m" "$bin" step "$tmp" "$form$m" $kind:0,$kind:1 sync-bn
        if [ $# -gt 0 ]; then
            run "${form}2 ranks, sync-BN" "$m" "$@" -np 2 "$bin" step "$tmp" "$form$m" $kind:0 sync-bn
        fi
    done
done
# The zoo's models, built by cohort from their names: d2l's ResNet-18 (reference program D) on one
# device and on two with sync-BN, the others on one.
for m in resnet18 lenet mnist-cnn mlp linear; do
    run "zoo, 1 device" $m "$bin" step "$tmp" zoo:$m $kind:0
done
if [ $# -gt 0 ]; then
    run "zoo, 2 ranks, sync-BN" resnet18 "$@" -np 2 "$bin" step "$tmp" zoo:resnet18 $kind:0 sync-bn
else
    run "zoo, 2 devices, sync-BN" resnet18 "$bin" step "$tmp" zoo:resnet18 $kind:0,$kind:1 sync-bn
fi
if [ "$kind" = cuda ]; then
    run "zoo, 1 device, sync-BN over NCCL" resnet18 env COHORT_NCCL=1 COHORT_CUDA_WRAP=0 "$bin" step "$tmp" zoo:resnet18 cuda:0 sync-bn
fi
"$py" "$here/graph_parity.py" check "$tmp" "$tmp/runs"
[ "$(wc -l <"$tmp/runs")" -eq "$runs" ] || { echo "FAIL: $runs runs, $(wc -l <"$tmp/runs") listed"; exit 1; }
echo "graph_parity: all $runs runs match PyTorch"
