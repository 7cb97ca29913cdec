#!/usr/bin/env bash
# Two devices learn what one device learns: lenet on the whole of Fashion-MNIST, 2 epochs, same
# seed and global batch (reference program A's batch; lr 0.05 with momentum 0.9, whose test accuracy settles instead of swinging by points from epoch to epoch as lr 0.2 without momentum does), on 1 device x 2 threads and on
# 2 devices x 1 thread. The 2-device test accuracy must be within 1 point of the 1-device one, and
# the first epoch's mean training loss within 1% of it: accuracy alone was inside the noise and
# passed with the gradient sync switched off. Measured here: the two runs' first-epoch losses part
# by 3.5e-4 relative (rounding, amplified over 235 steps of momentum SGD); with the sync off the
# 2-device loss is 14% higher (0.988 against 0.869). At 2 epochs (3 until CI's budget asked for the
# time) one device reaches 0.836 and two 0.833; at 3, 0.856 and 0.855.
set -euo pipefail
cohort=$1 data=$2
[ -s "$data/fashion-mnist/train-images-idx3-ubyte.gz" ] || { echo "parallel_accuracy: no data in $data/fashion-mnist"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

run() { # name devices
    "$cohort" train --model lenet --data "$data/fashion-mnist" --epochs 2 --batch-size 256 --lr 0.05 \
        --momentum 0.9 --seed 1 --threads 2 --devices "$2" --no-progress --metrics "$tmp/$1.jsonl" | tee "$tmp/$1.out"
}
run one cpu:0
run two cpu:0,cpu:1
grep -Eq '^epoch 2, loss [0-9.]+, train acc [0-9.]+, test acc [0-9.]+, time [0-9.]+ sec, [0-9]+ img/s on \[cpu:0, cpu:1\]$' "$tmp/two.out" \
    || { echo "FAIL: epoch line of the 2-device run"; exit 1; }
loss1() { head -n 1 "$1" | sed -n 's/.*"loss": \([0-9.]*\).*/\1/p'; }
l1=$(loss1 "$tmp/one.jsonl") l2=$(loss1 "$tmp/two.jsonl")
echo "parallel_accuracy: epoch 1 loss: 1 device $l1, 2 devices $l2"
awk -v a="$l1" -v b="$l2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 1e-2 * a) }' \
    || { echo "FAIL: the first epoch's loss differs by more than 1%"; exit 1; }
acc() { tail -n 1 "$1" | sed -n 's/.*"test_acc": \([0-9.]*\).*/\1/p'; }
a1=$(acc "$tmp/one.jsonl") a2=$(acc "$tmp/two.jsonl")
echo "parallel_accuracy: 1 device $a1, 2 devices $a2"
awk -v a="$a1" -v b="$a2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01 && a >= 0.80) }' \
    || { echo "FAIL: more than 1 point apart, or below 0.80"; exit 1; }
