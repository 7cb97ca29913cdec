#!/usr/bin/env bash
# Two devices learn what one device learns: lenet on the whole of Fashion-MNIST, 5 epochs, same
# seed and global batch (reference program A's batch; lr 0.05 with momentum 0.9, whose test accuracy settles instead of swinging by points from epoch to epoch as lr 0.2 without momentum does), on 1 device x 2 threads and on
# 2 devices x 1 thread. The 2-device test accuracy must be within 1 point of the 1-device one.
set -euo pipefail
cohort=$1 data=$2
[ -s "$data/fashion-mnist/train-images-idx3-ubyte.gz" ] || { echo "parallel_accuracy: no data in $data/fashion-mnist"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

run() { # name devices
    "$cohort" train --model lenet --data "$data/fashion-mnist" --epochs 5 --batch-size 256 --lr 0.05 \
        --momentum 0.9 --seed 1 --threads 2 --devices "$2" --no-progress --metrics "$tmp/$1.jsonl" | tee "$tmp/$1.out"
}
run one cpu:0
run two cpu:0,cpu:1
grep -Eq '^epoch 5, loss [0-9.]+, train acc [0-9.]+, test acc [0-9.]+, time [0-9.]+ sec, [0-9]+ img/s on \[cpu:0, cpu:1\]$' "$tmp/two.out" \
    || { echo "FAIL: epoch line of the 2-device run"; exit 1; }
acc() { tail -n 1 "$1" | sed -n 's/.*"test_acc": \([0-9.]*\).*/\1/p'; }
a1=$(acc "$tmp/one.jsonl") a2=$(acc "$tmp/two.jsonl")
echo "parallel_accuracy: 1 device $a1, 2 devices $a2"
awk -v a="$a1" -v b="$a2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01 && a >= 0.80) }' \
    || { echo "FAIL: more than 1 point apart, or below 0.80"; exit 1; }
