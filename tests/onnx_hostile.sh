#!/usr/bin/env bash
# Hostile and careless ONNX files (onnx_hostile.py makes them from a real training export): each
# gives one line on stderr containing what the case expects, exit 2, no crash (the sanitizer pass
# runs this too). The unedited export trains, so the cases fail for their edit, not for the model.
# usage: onnx_hostile.sh COHORT DATA_ROOT
set -uo pipefail
cohort=$1 data=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 "$(dirname "$0")/onnx_hostile.py" "$tmp" || exit 1
fails=0 passes=0
T=(train --data "$data/fashion-mnist" --epochs 1 --train-limit 128 --test-limit 64 -b 32 --no-progress)

expect() { # code needle -- command...
    local code=$1 needle=$2; shift 3
    "$@" >"$tmp/out" 2>"$tmp/err"; local got=$?
    local lines; lines=$(wc -l <"$tmp/err")
    if [ "$got" -ne "$code" ] || { [ -n "$needle" ] && ! grep -qF -- "$needle" "$tmp/err"; } ||
       { [ "$code" -ne 0 ] && [ "$lines" -ne 1 ]; }; then
        echo "FAIL: $* -> exit $got (want $code and '$needle'), stderr:"; cat "$tmp/err"; fails=$((fails + 1))
    else
        passes=$((passes + 1))
    fi
}

expect 0 "" -- "$cohort" "${T[@]}" --model "$tmp/good.onnx"
while IFS=$'\t' read -r name needle; do
    expect 2 "$needle" -- "$cohort" "${T[@]}" --model "$tmp/$name.onnx"
    # Every message names the file.
    # (other_data is the trainer's verdict on model and data, naming the model by the file's name.)
    [ "$name" = other_data ] || grep -qF "$tmp/$name.onnx" "$tmp/err" || { echo "FAIL: $name: the line does not name the file"; fails=$((fails + 1)); }
done <"$tmp/cases"
# Three operators cohort lacks: a line for each, naming its op type (and module), then one with
# what cohort imports; exit 2.
"$cohort" "${T[@]}" --model "$tmp/three_unknown.onnx" >"$tmp/out" 2>"$tmp/err"; got=$?
if [ $got -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 4 ] &&
   grep -qF "node '/act/Relu' (Elu): operator 'Elu' is not supported (nn.ELU, in module act)" "$tmp/err" &&
   grep -qF "(ReduceMax): operator 'ReduceMax' is not supported (a max over an axis, in module up1)" "$tmp/err" &&
   grep -qF "(InstanceNormalization): operator 'InstanceNormalization' is not supported (nn.InstanceNorm2d, in module norm)" "$tmp/err" &&
   grep -qF "3 operators above are not supported; cohort imports Conv" "$tmp/err" &&
   [ "$(grep -c "^cohort train: $tmp/three_unknown.onnx: " "$tmp/err")" -eq 4 ]; then
    passes=$((passes + 1))
else
    echo "FAIL: three unsupported operators -> exit $got, stderr:"; cat "$tmp/err"; fails=$((fails + 1))
fi
# Not a regular file: a FIFO with no writer must not hang, a folder is no model.
mkfifo "$tmp/fifo.onnx"
expect 2 "is a FIFO, expected a file" -- timeout 20 "$cohort" "${T[@]}" --model "$tmp/fifo.onnx"
mkdir "$tmp/dir.onnx"
expect 2 "dir.onnx" -- "$cohort" "${T[@]}" --model "$tmp/dir.onnx"
expect 2 "missing.onnx" -- "$cohort" "${T[@]}" --model "$tmp/missing.onnx"
# --init file needs weights: a zoo model has none.
expect 2 "--init file: the model carries no weights" -- "$cohort" "${T[@]}" --model lenet --init file

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
