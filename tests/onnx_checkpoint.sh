#!/usr/bin/env bash
# A model imported from ONNX is kept in its checkpoints (graph.json), so that with the ONNX file
# gone: --resume (without --model) continues exactly as an uninterrupted run, cohort eval gives the
# accuracy training reported, cohort export gives a state_dict PyTorch's nn.Module loads strictly
# and that PyTorch evaluates to the same accuracy; a damaged graph.json, or a checkpoint of another
# model, is one line and exit 2.
# usage: onnx_checkpoint.sh COHORT DATA_ROOT
set -euo pipefail
cohort=$1 data=$2
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$py" "$here/graph_parity.py" export "$tmp"
T=(--data "$data/fashion-mnist" --train-limit 1024 --test-limit 256 -b 64 --lr 0.05 --momentum 0.9 --no-progress
   --devices cpu:0,cpu:1)
fail() { echo "FAIL: $*"; exit 1; }
strip() { sed 's/, time .*//' "$1"; }

# --dry-run labels a BatchNorm over features as PyTorch does (it said BatchNorm2d).
"$cohort" train --model "$tmp/headnet.onnx" --data "$data/fashion-mnist" --train-limit 64 --test-limit 32 --dry-run \
    >"$tmp/dry" 2>&1
grep -Eq '^ +bn_fc +BatchNorm1d ' "$tmp/dry" && grep -Eq '^ +bn1 +BatchNorm2d ' "$tmp/dry" ||
    fail "--dry-run does not label bn_fc BatchNorm1d and bn1 BatchNorm2d: $(grep -i batchnorm "$tmp/dry")"
"$cohort" train --model "$tmp/densenet.onnx" "${T[@]}" --epochs 2 >"$tmp/full"
"$cohort" train --model "$tmp/densenet.onnx" "${T[@]}" --epochs 1 --checkpoint-dir "$tmp/ck" >"$tmp/first"
mv "$tmp/densenet.onnx" "$tmp/gone.onnx"
"$cohort" train --resume --checkpoint-dir "$tmp/ck" "${T[@]}" --epochs 2 >"$tmp/second"
diff <(strip "$tmp/full") <(cat "$tmp/first" "$tmp/second" | sed 's/, time .*//') ||
    fail "the resumed run differs from the uninterrupted one"
echo "resumed without the ONNX file: $(tail -1 "$tmp/second" | sed 's/, time .*//')"

acc=$(sed -n 's/^epoch 2, .*test acc \([0-9.]*\),.*/\1/p' "$tmp/second")
"$cohort" eval --checkpoint "$tmp/ck" --data "$data/fashion-mnist" --test-limit 256 >"$tmp/eval"
grep -q "test acc $acc " "$tmp/eval" || fail "cohort eval says '$(cat "$tmp/eval")', training said test acc $acc"

"$cohort" export --checkpoint "$tmp/ck" --out "$tmp/state.safetensors"
correct=$("$py" - "$here" "$tmp/state.safetensors" "$data" <<'PY'
import os, sys
import torch
sys.path.insert(0, sys.argv[1])
from graph_models import MODELS
from graph_parity import as_batch, read_idx
from torch_load import load_file
m = MODELS["densenet"]()
m.load_state_dict(load_file(sys.argv[2]), strict=True)
m.eval()
x, y = as_batch(*read_idx(os.path.join(sys.argv[3], "fashion-mnist"), "t10k", 256))
with torch.no_grad():
    print(int((m(x).argmax(1) == y).sum()))
PY
)
"$py" -c "import sys; sys.exit(0 if round(float('$acc') * 256) == $correct else 1)" ||
    fail "PyTorch classifies $correct of 256 with the exported weights; cohort said $acc"
echo "export: strict load into DenseNet, PyTorch eval $correct/256 = cohort's $acc"

# Another model's checkpoint, and a damaged graph.json: one line, exit 2.
expect() { # needle -- command...
    local needle=$1; shift 2
    local code=0
    "$@" >"$tmp/out" 2>"$tmp/err" || code=$?
    [ "$code" -eq 2 ] || fail "$*: exit $code, want 2: $(cat "$tmp/err")"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -qF -- "$needle" "$tmp/err" ||
        fail "$*: want one line with '$needle', got: $(cat "$tmp/err")"
}
# (lognet's graph under densenet's name: only the graphs differ.)
mkdir "$tmp/other"; cp "$tmp/lognet.onnx" "$tmp/other/densenet.onnx"
expect "the checkpoint's model (its graph.json) is not this run's graph" -- \
    "$cohort" train --model "$tmp/other/densenet.onnx" --resume "$tmp/ck" "${T[@]}" --epochs 3
expect "a checkpoint of" -- "$cohort" train --model lenet --resume "$tmp/ck" "${T[@]}" --epochs 3
# cohort eval --model FILE beside a checkpoint reads FILE: the same graph evaluates as without it,
# another graph, a missing file and random bytes are refused (FILE was once ignored, exit 0).
"$cohort" eval --checkpoint "$tmp/ck" --model "$tmp/gone.onnx" --data "$data/fashion-mnist" --test-limit 256 >"$tmp/eval2"
grep -q "test acc $acc " "$tmp/eval2" || fail "eval --model (the same graph) says '$(cat "$tmp/eval2")', want $acc"
E2=(--data "$data/fashion-mnist" --test-limit 64)
expect "is not $tmp/other/densenet.onnx's graph" -- "$cohort" eval --checkpoint "$tmp/ck" --model "$tmp/other/densenet.onnx" "${E2[@]}"
expect "$tmp/missing.onnx" -- "$cohort" eval --checkpoint "$tmp/ck" --model "$tmp/missing.onnx" "${E2[@]}"
head -c 3000 /dev/urandom >"$tmp/random.onnx"
expect "$tmp/random.onnx" -- "$cohort" eval --checkpoint "$tmp/ck" --model "$tmp/random.onnx" "${E2[@]}"
expect "a checkpoint of densenet, not lenet" -- "$cohort" eval --checkpoint "$tmp/ck" --model lenet "${E2[@]}"
g=$tmp/ck/epoch-0002/graph.json
cp "$g" "$tmp/graph.orig"
edit() { "$py" -c "import json,sys; d=json.load(open('$g')); $1; json.dump(d, open('$g','w'))"; }
edit "d['nodes'][1]['in']=[99]"
expect "reads tensor 99, which no earlier entry makes" -- "$cohort" eval --checkpoint "$tmp/ck" --data "$data/fashion-mnist" --test-limit 64
cp "$tmp/graph.orig" "$g"; edit "d['nodes'][0]['op']='elu'"
expect "unknown op 'elu'" -- "$cohort" eval --checkpoint "$tmp/ck" --data "$data/fashion-mnist" --test-limit 64
cp "$tmp/graph.orig" "$g"; edit "d['nodes'][0]['kernel']=1e9"
expect "'kernel' is not a number in 1..4096" -- "$cohort" export --checkpoint "$tmp/ck" --out "$tmp/x.safetensors"
cp "$tmp/graph.orig" "$g"; edit "d['nodes'][0]['out_channels']=9"
expect "tensor 'conv0.weight' has shape [8x1x3x3], the model needs [9x1x3x3]" -- "$cohort" eval --checkpoint "$tmp/ck" --data "$data/fashion-mnist" --test-limit 64
cp "$tmp/graph.orig" "$g"; edit "d['nodes']={}"
expect "'nodes' is not a list of at most" -- "$cohort" eval --checkpoint "$tmp/ck" --data "$data/fashion-mnist" --test-limit 64
cp "$tmp/graph.orig" "$g"; edit "d['output']=10**6"
expect "'output'" -- "$cohort" eval --checkpoint "$tmp/ck" --data "$data/fashion-mnist" --test-limit 64
printf '{"format_version": 1, "name": "x", "name": "y"}' >"$g"
expect "key 'name' appears twice" -- "$cohort" eval --checkpoint "$tmp/ck" --data "$data/fashion-mnist" --test-limit 64
echo "onnx_checkpoint: all checks passed"
