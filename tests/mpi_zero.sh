#!/usr/bin/env bash
# --zero 1 (optimizer state sharded over the job's replicas) under mpirun:
#  - SGD with momentum and Adam on 2 ranks, and Adam on 2 ranks x 2 devices (the hierarchical path)
#    with a model whose parameter count does not divide by the 4 replicas, give the plain run's
#    checkpoint bit for bit, parameters and optimizer state (each replica's update of its shard is
#    the same arithmetic; the shards are gathered exactly);
#  - a --zero 1 checkpoint resumed without it, and a plain one resumed with it, end where the
#    uninterrupted plain run ends;
#  - the optimizer bytes each rank holds (--metrics) are the plain run's divided by the replicas;
#  - the same with 3 devices in one process (threads), also on the lazy backend;
#  - --dry-run names the shard; ranks that disagree on --zero are refused.
#   mpi_zero.sh COHORT DATA_ROOT MPIRUN...
set -uo pipefail
cohort=$1 data=$2; shift 2
mpirun=("$@")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

# The sanitizer pass (COHORT_SANITIZED=1) trains on about half the samples: the same paths in 16
# steps an epoch instead of 32.
limit=2000 test_limit=500
if [ "${COHORT_SANITIZED:-0}" = 1 ]; then limit=1024 test_limit=256; fi
T=(train --data "$data/mnist" --train-limit $limit --test-limit $test_limit -b 64 --threads 1 --no-progress)

# run NAME ARGS...: 2 ranks, the checkpoint in $tmp/NAME, the metrics in $tmp/NAME.jsonl.
run() {
    local name=$1; shift
    if ! timeout 300 "${mpirun[@]}" -np 2 "$cohort" "${T[@]}" --checkpoint-dir "$tmp/$name" \
            --metrics "$tmp/$name.jsonl" "$@" >"$tmp/$name.out" 2>&1; then
        bad "$name: exit $?"; cat "$tmp/$name.out"; return 1
    fi
}

# same A B EPOCH: the two runs' checkpoints of EPOCH hold the same bits.
same() {
    local f
    for f in model.safetensors optimizer.safetensors; do
        if cmp -s "$tmp/$1/epoch-$3/$f" "$tmp/$2/epoch-$3/$f"; then ok; else bad "$1 and $2 differ in epoch $3's $f"; fi
    done
}

bytes() { sed -n 's/.*"optimizer_bytes": \([0-9]*\).*/\1/p' "$tmp/$1.jsonl" | tail -1; }

SGD=(--model lenet --epochs 2 --momentum 0.9 --lr 0.05)
ADAM=(--model lenet --epochs 2 --optimizer adam --lr 0.001)
run sgd "${SGD[@]}" && run sgd_zero "${SGD[@]}" --zero 1 && same sgd sgd_zero 0002
run adam "${ADAM[@]}" && run adam_zero "${ADAM[@]}" --zero 1 && same adam adam_zero 0002
grep -q '"zero": 1' "$tmp/adam_zero.jsonl" && ok || bad "the metrics of a --zero 1 run do not say so"
# Every rank holds half of the optimizer state (one shard of two; shards differ by one element).
p=$(bytes adam) z=$(bytes adam_zero)
if [ -n "$p" ] && [ -n "$z" ] && [ "$z" -gt 0 ] && [ $((2 * z - p)) -le 8 ] && [ $((p - 2 * z)) -le 8 ]; then ok
else bad "optimizer bytes per rank: $z with --zero 1, $p without (expected half)"; fi

# 4 replicas over 2 ranks: the linear model's 7850 parameters cut into shards of 1962 and 1963.
LIN=(--model linear --epochs 2 --optimizer adam --lr 0.01 --devices cpu*2)
run lin "${LIN[@]}" && run lin_zero "${LIN[@]}" --zero 1 && same lin lin_zero 0002

# One process, 3 devices (threads): lenet's 129068 parameters in shards of 43022 and 43023; and the
# lazy backend (memory that only the backend's own operations may touch, work run only when waited
# for), whose staging paths the shards' exchanges and the checkpoint's gather go through.
local_run() {
    local name=$1; shift
    timeout 300 "$cohort" "${T[@]}" --checkpoint-dir "$tmp/$name" "$@" >"$tmp/$name.out" 2>&1 ||
        { bad "$name: exit $?"; cat "$tmp/$name.out"; return 1; }
}
local_run loc "${ADAM[@]}" --devices cpu*3 && local_run loc_zero "${ADAM[@]}" --devices cpu*3 --zero 1 &&
    same loc loc_zero 0002
local_run loc_lazy "${ADAM[@]}" --devices 'lazy*3' --zero 1 && same loc loc_lazy 0002

# Resume across the flag, both ways: epoch 1 with one setting, epoch 2 with the other.
run sgd_z1 "${SGD[@]}" --epochs 1 --zero 1 &&
    run sgd_z1_plain "${SGD[@]}" --resume "$tmp/sgd_z1/epoch-0001" && same sgd sgd_z1_plain 0002
run sgd_p1 "${SGD[@]}" --epochs 1 &&
    run sgd_p1_zero "${SGD[@]}" --zero 1 --resume "$tmp/sgd_p1/epoch-0001" && same sgd sgd_p1_zero 0002
run adam_z1 "${ADAM[@]}" --epochs 1 --zero 1 &&
    run adam_z1_plain "${ADAM[@]}" --resume "$tmp/adam_z1/epoch-0001" && same adam adam_z1_plain 0002

# --dry-run shows the shard.
"${mpirun[@]}" -np 2 "$cohort" "${T[@]}" "${ADAM[@]}" --zero 1 --dry-run >"$tmp/dry" 2>&1
grep -q "optimizer state [0-9.]* MiB (its 1/2 shard, --zero 1)" "$tmp/dry" && ok || { bad "dry-run: no shard"; cat "$tmp/dry"; }

# Ranks that disagree: refused before training, naming the flag.
timeout 60 "${mpirun[@]}" -np 2 sh -c 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then z=1; else z=0; fi;
    exec "$0" "$@" --zero $z' "$cohort" "${T[@]}" "${SGD[@]}" >"$tmp/dis" 2>&1
[ $? -ne 0 ] && grep -q -- "--zero" "$tmp/dis" && ok || { bad "ranks disagreeing on --zero"; cat "$tmp/dis"; }

echo "mpi_zero: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
