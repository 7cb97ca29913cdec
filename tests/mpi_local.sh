#!/usr/bin/env bash
# --devices KIND:local under mpirun: each rank of a host takes the device its local rank numbers
# (torchrun's LOCAL_RANK, so that `mpirun -np 8 cohort train --devices cuda:local` gives every rank
# its own GPU). On the lazy backend, two ranks of this host: rank 0's worker log names lazy:0 and
# rank 1's lazy:1, and the job trains to the figures of the same job with both ranks on lazy:0 (a
# device's index names it; the arithmetic is the same).
#   mpi_local.sh COHORT DATA_ROOT MPIRUN...
set -uo pipefail
cohort=$1 data=$2; shift 2
mpirun=("$@")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0
T=(train --model lenet --data "$data/mnist" --train-limit 1024 --test-limit 500 -b 64 --epochs 1 --lr 0.1 --seed 3
   --threads 1 --no-progress)
for devices in lazy:local lazy:0; do
    if ! timeout 300 "${mpirun[@]}" -np 2 "$cohort" "${T[@]}" --devices "$devices" --log-dir "$tmp/$devices" \
            >"$tmp/$devices.out" 2>&1; then
        echo "FAIL: --devices $devices on 2 ranks: exit status $?"; cat "$tmp/$devices.out"; fails=$((fails + 1))
    fi
done
for r in 0 1; do
    if grep -q "^rank $r of 2, local rank $r of 2, .*devices \[lazy:$r\]" "$tmp/lazy:local/workerlog.$r"; then
        echo "ok: rank $r trains on lazy:$r"
    else
        echo "FAIL: rank $r's worker log does not name lazy:$r:"; head -2 "$tmp/lazy:local/workerlog.$r"; fails=$((fails + 1))
    fi
done
a=$(grep '^epoch 1' "$tmp/lazy:local.out" | cut -d, -f1-4) b=$(grep '^epoch 1' "$tmp/lazy:0.out" | cut -d, -f1-4)
if [ -n "$a" ] && [ "$a" = "$b" ]; then
    echo "ok: the same figures as both ranks on lazy:0 ($a)"
else
    echo "FAIL: lazy:local gave '$a', lazy:0 '$b'"; fails=$((fails + 1))
fi
exit $((fails > 0))
