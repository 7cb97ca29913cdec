#!/usr/bin/env bash
# Trained models must reach a stated accuracy on real data (small subsets, so CI stays quick).
# A broken gradient, loss or update rule leaves these runs near chance (0.10).
set -euo pipefail
cohort=$1 data=$2
for d in mnist fashion-mnist; do
    [ -s "$data/$d/train-images-idx3-ubyte.gz" ] || { echo "train_accuracy: no data in $data/$d (run scripts/fetch-data)"; exit 1; }
done
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

check() { # name threshold metrics-file
    local acc; acc=$(tail -n 1 "$3" | sed -n 's/.*"test_acc": \([0-9.]*\).*/\1/p')
    echo "$1: test acc $acc (threshold $2)"
    awk -v a="$acc" -v t="$2" 'BEGIN { exit !(a >= t) }' || { echo "FAIL: $1 below $2"; exit 1; }
}

# Reference program C's recipe (mnist-cnn, batch 100, lr 0.01) on 6000 MNIST images, 2 epochs.
"$cohort" train --model mnist-cnn --data "$data/mnist" --epochs 2 --batch-size 100 --lr 0.01 \
    --momentum 0.9 --train-limit 6000 --test-limit 2000 --metrics "$tmp/cnn.jsonl" --threads 2 | tee "$tmp/cnn.out"
check mnist-cnn 0.90 "$tmp/cnn.jsonl"
# The epoch line the users read.
grep -Eq '^epoch 2, loss [0-9.]+, train acc [0-9.]+, test acc [0-9.]+, time [0-9.]+ sec, [0-9]+ img/s on \[cpu:0\]$' "$tmp/cnn.out" \
    || { echo "FAIL: epoch line format"; cat "$tmp/cnn.out"; exit 1; }

# lenet with PyTorch's default init and momentum on 6000 Fashion-MNIST images.
"$cohort" train --model lenet --data "$data/fashion-mnist" --epochs 3 --batch-size 64 --lr 0.05 \
    --momentum 0.9 --train-limit 6000 --test-limit 2000 --metrics "$tmp/lenet.jsonl" --threads 2
check lenet 0.70 "$tmp/lenet.jsonl"

# resnet18 (BatchNorm, residual blocks) learns too: 1500 images, 1 epoch (47 steps, enough for
# the BatchNorm running statistics that evaluation uses to settle).
"$cohort" train --model resnet18 --data "$data/fashion-mnist" --epochs 1 --batch-size 32 --lr 0.05 \
    --train-limit 1500 --test-limit 500 --metrics "$tmp/resnet.jsonl" --threads 2
check resnet18 0.50 "$tmp/resnet.jsonl"

# Same command, same bits: two runs give identical metrics apart from timing.
for i in 1 2; do
    "$cohort" train --model lenet --data "$data/fashion-mnist" --epochs 1 --batch-size 64 --lr 0.05 \
        --train-limit 640 --test-limit 200 --seed 3 --threads 2 --metrics "$tmp/det$i.jsonl" >/dev/null
    sed 's/"time_s": [0-9.]*, "images_per_s": [0-9.]*, //' "$tmp/det$i.jsonl" > "$tmp/det$i.txt"
done
cmp "$tmp/det1.txt" "$tmp/det2.txt" || { echo "FAIL: same seed, different results"; exit 1; }
echo "train_accuracy: all passed"
