#!/usr/bin/env bash
# --trace: the timeline is valid, nested, complete and shows the gradient sync overlapping backward:
# one process with 2 devices (lenet, small buckets), and, with MPI, 2 ranks x 2 devices of resnet18
# for 5 steps, and 2 ranks x 1 device (buckets in flight together, on lanes).
#   trace.sh COHORT DATA_ROOT [MPIRUN...]
set -uo pipefail
cohort=$1 data=$2/fashion-mnist; shift 2
mpirun=("$@")
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0
run() { # name ranks devices steps -- command...
    local name=$1 ranks=$2 devices=$3 steps=$4; shift 5
    "$@" --trace "$tmp/$name.json" --trace-steps "$steps" --no-progress >/dev/null &&
        python3 "$here/trace_check.py" "$tmp/$name.json" "$ranks" "$devices" "$steps" &&
        ! ls "$tmp/$name.json".* 2>/dev/null
    [ $? -eq 0 ] || { echo "FAIL: $name"; fails=$((fails + 1)); }
}
L=(train --model lenet --data "$data" --train-limit 3072 --test-limit 64 -b 512 --epochs 1 --bucket-mb 0.1)
run lenet-1x2 1 2 3 -- "$cohort" "${L[@]}" --devices cpu:0,cpu:1
if [ ${#mpirun[@]} -gt 0 ]; then
    R=(train --model resnet18 --data "$data" --train-limit 160 --test-limit 32 -b 32 --epochs 1)
    # The sanitizer pass (COHORT_SANITIZED=1) runs the 2 x 2 job on lenet's small buckets instead:
    # the same hierarchical sync and timeline code, without resnet18's minute of sanitized kernels.
    name=resnet18-2x2
    [ "${COHORT_SANITIZED:-0}" = 1 ] && R=("${L[@]}") name=lenet-2x2
    run $name 2 2 5 -- "${mpirun[@]}" -np 2 "$cohort" "${R[@]}" --devices cpu:0,cpu:1
    run lenet-2x1 2 1 4 -- "${mpirun[@]}" -np 2 "$cohort" "${L[@]}"
fi
[ "$fails" -eq 0 ]
