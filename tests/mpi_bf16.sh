#!/usr/bin/env bash
# --precision bf16 over Open MPI ranks, on real Fashion-MNIST with resnet18: an epoch on 2 ranks of
# one device each ends with the bits of the same job on 2 devices in one process (model and
# optimizer files, and the epoch line's figures), with bf16 products on and off
# (COHORT_BF16_PRODUCTS: a CPU picks one, cpu_isa.c), and not with fp32's (bf16 took effect). Two
# members sum in either order to the same bits, so equal is the bound. A rank given --precision
# bf16 alone is refused at start-up, naming the flag.
# Exits 77 (ctest: skipped, never passed) on a CPU without native bf16.
#   mpi_bf16.sh COHORT DATA_ROOT MPIRUN...
set -uo pipefail
cohort=$1 data=$2; shift 2
mpirun=("$@")
if ! "$cohort" info | grep -q '^bf16: *native'; then
    echo "skipped: no native bf16 here ($("$cohort" info | grep '^bf16:'))"
    exit 77
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
T=(train --model resnet18 --data "$data/fashion-mnist" --train-limit 160 --test-limit 64 -b 32 --epochs 1
   --lr 0.05 --momentum 0.8 --seed 4 --no-progress)
# run NAME ARGS...: the job's epoch line in $tmp/NAME.line, its checkpoint in $tmp/NAME/.
run() {
    local name=$1; shift
    if ! timeout 300 "$@" --checkpoint-dir "$tmp/$name" >"$tmp/$name.out" 2>&1; then
        fail "$name: exit status $?"; cat "$tmp/$name.out"; return
    fi
    grep '^epoch 1' "$tmp/$name.out" | cut -d, -f1-4 >"$tmp/$name.line"
}
same_files() {
    for f in model.safetensors optimizer.safetensors; do
        cmp -s "$tmp/$1/epoch-0001/$f" "$tmp/$2/epoch-0001/$f" || return 1
    done
}
run fp32 "$cohort" "${T[@]}" --devices cpu:0,cpu:1 --threads 2
for products in on off; do
    export COHORT_BF16_PRODUCTS=$products
    run "ranks-$products" "${mpirun[@]}" -np 2 -x COHORT_BF16_PRODUCTS "$cohort" "${T[@]}" --precision bf16 --threads 1
    run "devices-$products" "$cohort" "${T[@]}" --precision bf16 --devices cpu:0,cpu:1 --threads 2
    if same_files "ranks-$products" "devices-$products" &&
            cmp -s "$tmp/ranks-$products.line" "$tmp/devices-$products.line" && [ -s "$tmp/ranks-$products.line" ]; then
        echo "ok: products $products: 2 ranks give the bits of 2 devices ($(cat "$tmp/ranks-$products.line"))"
    else
        fail "products $products: 2 ranks ($(cat "$tmp/ranks-$products.line")) differ from 2 devices ($(cat "$tmp/devices-$products.line"))"
    fi
    if same_files "ranks-$products" fp32; then
        fail "products $products: bf16 gave fp32's bits"
    else
        echo "ok: products $products: not fp32's bits ($(cat "$tmp/fp32.line"))"
    fi
done
unset COHORT_BF16_PRODUCTS
out=$(timeout 60 "${mpirun[@]}" -np 1 "$cohort" "${T[@]}" --threads 1 : -np 1 "$cohort" "${T[@]}" --threads 1 \
      --precision bf16 2>&1)
rc=$?
if [ $rc -ne 0 ] && grep -q "disagrees with rank 0 on the flags (rank 1 has '--precision')" <<<"$out"; then
    echo "ok: --precision bf16 on rank 1 alone is refused"
else
    fail "--precision bf16 on rank 1 alone: exit status $rc"; echo "$out" | tail -5
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
