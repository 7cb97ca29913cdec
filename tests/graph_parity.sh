#!/usr/bin/env bash
# Graphs built with ch_graph_*, and the same models exported by PyTorch to ONNX and imported, against PyTorch (graph_models.py / graph_models.c: a ResNet with
# downsample shortcuts, a MobileNet with depthwise convs, ReLU6 and squeeze-excitation, a DenseNet
# with concat and pools in ceil_mode, a net ending in log_softmax with view):
#   one SGD step from PyTorch's initial weights gives PyTorch's parameters and BatchNorm buffers
#   (within 1e-4), on one device, on two with sync-BN and on two MPI ranks with sync-BN; PyTorch
#   loads each result with load_state_dict(strict=True) and its eval accuracy is cohort's.
# usage: graph_parity.sh GRAPH_PARITY DATA_ROOT [MPIRUN ARGS...]
set -euo pipefail
bin=$1 data=$2; shift 2
py=/usr/bin/python3
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

for m in resnet mobilenet densenet lognet headnet; do
    for form in "" onnx:; do
        run "${form}1 device" "$m" "$bin" step "$tmp" "$form$m" cpu:0
        run "${form}2 devices, sync-BN" "$m" "$bin" step "$tmp" "$form$m" cpu:0,cpu:1 sync-bn
        if [ $# -gt 0 ]; then
            run "${form}2 ranks, sync-BN" "$m" "$@" -np 2 "$bin" step "$tmp" "$form$m" cpu:0 sync-bn
        fi
    done
done
# The zoo's d2l ResNet-18 (reference program D), built by cohort from its name.
run "zoo, 1 device" resnet18 "$bin" step "$tmp" zoo:resnet18 cpu:0
if [ $# -gt 0 ]; then
    run "zoo, 2 ranks, sync-BN" resnet18 "$@" -np 2 "$bin" step "$tmp" zoo:resnet18 cpu:0 sync-bn
else
    run "zoo, 2 devices, sync-BN" resnet18 "$bin" step "$tmp" zoo:resnet18 cpu:0,cpu:1 sync-bn
fi
"$py" "$here/graph_parity.py" check "$tmp" "$tmp/runs"
[ "$(wc -l <"$tmp/runs")" -eq "$runs" ] || { echo "FAIL: $runs runs, $(wc -l <"$tmp/runs") listed"; exit 1; }
echo "graph_parity: all $runs runs match PyTorch"
