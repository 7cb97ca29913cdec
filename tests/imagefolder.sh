#!/usr/bin/env bash
# ImageFolder end to end, on a folder this test writes (tests/make_imagefolder.py: MNIST digits as PNG
# and JPEG files, gray, RGB, RGBA and palette, odd sizes, nested folders):
#   - resnet18-imagenet at 64x64 (RandomResizedCrop, flips, ImageNet normalization) learns on two
#     devices with 2 loader threads: test accuracy well above the 0.1 of chance; cohort eval of its
#     checkpoint (image size and normalization from the checkpoint) prints the same accuracy;
#   - the loader's worker count does not change a bit of the results;
#   - damaged data: one line naming the file and exit 2, or with --skip-bad-images a count.
#   imagefolder.sh COHORT MNIST_DIR [quick]     (quick: leave out the learning run)
set -uo pipefail
cohort=$1 mnist=$2 quick=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi; }
acc() { sed -n "s/^epoch $2, .*test acc \([0-9.]*\),.*/\1/p" "$1"; }
above() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }
# The epoch lines without their timing: what must not depend on the loader.
figures() { sed -n 's/^\(epoch [0-9]*, loss [0-9.]*, train acc [0-9.]*, test acc [0-9.]*\),.*/\1/p' "$1"; }

/usr/bin/python3 "$here/make_imagefolder.py" "$mnist" "$tmp/digits" --train 150 --val 30 ||
    { echo "FAIL: make_imagefolder.py"; exit 1; }

if [ "$quick" != quick ]; then
    # lr 0.02: at 0.05 these 96 steps sat on the edge of divergence, and a change in rounding alone
    # (seed 2, or a reordered sum in a kernel) ended at 0.15-0.33; at 0.02 seeds 0-3 reach 0.40-0.68.
    "$cohort" train --model resnet18-imagenet --data "$tmp/digits" --image-size 64 --epochs 3 -b 64 --lr 0.02 \
        --momentum 0.9 --random-flip --devices cpu:0,cpu:1 -j 2 --no-progress \
        --checkpoint-dir "$tmp/ck" --metrics "$tmp/m.jsonl" >"$tmp/learn.out" 2>&1
    cat "$tmp/learn.out"
    above "$(acc "$tmp/learn.out" 3)" 0.35
    rc=$?; ok "resnet18-imagenet, 64x64 crops of 1500 digit images, 2 devices, -j 2: test acc $(acc "$tmp/learn.out" 3) >= 0.35 (chance 0.1)" $rc
    "$cohort" eval --checkpoint "$tmp/ck" --data "$tmp/digits" >"$tmp/eval.out" 2>&1
    e=$(sed -n 's/^test loss [0-9.]*, test acc \([0-9.]*\) (300 images).*/\1/p' "$tmp/eval.out")
    [ -n "$e" ] && [ "$e" = "$(acc "$tmp/learn.out" 3)" ]
    rc=$?; ok "cohort eval of the checkpoint (64x64 and imagenet normalization from it): test acc $e, as training printed" $rc
fi

# The same bits whatever the loader: in the step (-j 0), 1 worker, 3 workers; one device and two.
for devices in cpu:0 cpu:0,cpu:1; do
    for j in 0 1 3; do
        "$cohort" train --model linear --data "$tmp/digits" --image-size 24 --epochs 2 -b 50 --lr 0.01 --random-flip \
            --devices "$devices" -j $j --train-limit 700 --no-progress >"$tmp/j$j.out" 2>&1
    done
    [ -n "$(figures "$tmp/j0.out")" ] && [ "$(figures "$tmp/j0.out")" = "$(figures "$tmp/j1.out")" ] &&
        [ "$(figures "$tmp/j0.out")" = "$(figures "$tmp/j3.out")" ]
    rc=$?; ok "[$devices]: -j 0, -j 1 and -j 3 print the same losses and accuracies: $(figures "$tmp/j3.out" | tail -1)" $rc
done

expect() { # needle -- command: exit 2 and one line that contains needle
    local needle=$1; shift 2
    timeout 120 "$@" >/dev/null 2>"$tmp/err"; local got=$?
    [ $got -eq 2 ] && grep -qF -- "$needle" "$tmp/err" && [ "$(wc -l <"$tmp/err")" -eq 1 ]
    rc=$?; ok "$(basename "$1") ${*:2:3}... -> exit $got: $(cat "$tmp/err")" $rc
}
small() { # a fresh copy of the first 3 classes, 20 images each
    rm -rf "$tmp/bad"; mkdir -p "$tmp/bad/train" "$tmp/bad/val"
    for c in 0 1 2; do
        mkdir -p "$tmp/bad/train/digit_$c" "$tmp/bad/val/digit_$c"
        find "$tmp/digits/train/digit_$c" -maxdepth 1 -type f | sort | head -20 | xargs cp -t "$tmp/bad/train/digit_$c"
        find "$tmp/digits/val/digit_$c" -maxdepth 1 -type f | sort | head -5 | xargs cp -t "$tmp/bad/val/digit_$c"
    done
}
train_bad=("$cohort" train --model linear --data "$tmp/bad" --image-size 16 --epochs 1 -b 16 --no-progress)

small; first=$(find "$tmp/bad/train/digit_1" -type f | sort | head -1)
head -c 200 "$first" >"$first.tmp" && mv "$first.tmp" "$first"
expect "$first: not a readable" -- "${train_bad[@]}"
expect "$first: not a readable" -- "${train_bad[@]}" -j 2
# --skip-bad-images: training goes on and says how many files it replaced.
small; for f in $(find "$tmp/bad/train/digit_2" -type f | sort | head -2); do printf 'garbage' >"$f"; done
"${train_bad[@]}" --skip-bad-images -j 2 >"$tmp/skip.out" 2>"$tmp/skip.err"
[ $? -eq 0 ] && grep -q "^epoch 1," "$tmp/skip.out" && grep -q "skipped 2 training images that did not decode" "$tmp/skip.err"
rc=$?; ok "--skip-bad-images trains on and reports: $(cat "$tmp/skip.err")" $rc
small; mkdir "$tmp/bad/train/digit_7"
expect "digit_7: an empty class folder" -- "${train_bad[@]}"
small; rm -rf "$tmp/bad/train"/*; mkdir "$tmp/bad/train/only"
expect "train: 1 class folder; an ImageFolder needs one folder per class and at least 2" -- "${train_bad[@]}" --dataset imagefolder
small; rm -rf "$tmp/bad/val"/*/*
expect "an empty class folder" -- "${train_bad[@]}"
small; mkdir "$tmp/bad/val/digit_9"; cp "$first" "$tmp/bad/val/digit_9/"
expect "val/digit_9: a class the training folder does not have" -- "${train_bad[@]}"
small; rm -rf "$tmp/bad/val"
expect "val: no such folder" -- "${train_bad[@]}"
# A PNG that declares 100000 x 100000 pixels: refused before any pixel memory is taken.
small; /usr/bin/python3 - "$tmp/bad/train/digit_0/huge.png" <<'EOF'
import struct, sys, zlib
def chunk(k, d): return struct.pack(">I", len(d)) + k + d + struct.pack(">I", zlib.crc32(k + d) & 0xffffffff)
open(sys.argv[1], "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0))
                              + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))
EOF
expect "huge.png: the image declares 100000x100000 pixels, more than the limit" -- "${train_bad[@]}"
expect "--random-crop is for IDX and CIFAR-10 data" -- "${train_bad[@]}" --random-crop 4
# Symbolic links: loops are walked once (3 links to "." once scanned for minutes), a second way
# into a folder does not count its images twice, and no link may lead out of the data set (a link
# to ../.. once labelled other classes' images).
dry() { "${train_bad[@]}" --dry-run 2>&1 | sed -n 's/.*trains on \([0-9]*\) of .*/\1/p; s/^data: .*train \([0-9]*\) .*/\1/p'; }
small; "${train_bad[@]}" --dry-run >"$tmp/plain.out" 2>&1
small; for k in 1 2 3; do ln -s . "$tmp/bad/train/digit_0/loop$k"; done; ln -s ../digit_0 "$tmp/bad/train/digit_0/again"
timeout 30 "${train_bad[@]}" --dry-run >"$tmp/loop.out" 2>&1; rc=$?
[ $rc -eq 0 ] && diff <(grep -i "samples" "$tmp/plain.out") <(grep -i "samples" "$tmp/loop.out") >/dev/null
rc=$?; ok "symlink loops: scanned once, promptly, the same samples ($(grep -i samples "$tmp/loop.out" | head -1))" $rc
small; ln -s ../.. "$tmp/bad/train/digit_0/up"
expect "digit_0/up: a symbolic link to" -- timeout 30 "${train_bad[@]}"
small; ln -s "$(dirname "$first")/../../../digits/train/digit_5" "$tmp/bad/train/digit_1/elsewhere"
expect "a class's images must come from its own folder" -- timeout 30 "${train_bad[@]}"
# Entries named like images that are no regular files (a dangling link, a link loop, a FIFO, a
# folder) are left out and counted in one line naming the first; they were once left out unsaid.
# A FIFO is never opened (it would block).
small; "${train_bad[@]}" --dry-run >"$tmp/plain.out" 2>&1
ln -s nowhere.png "$tmp/bad/train/digit_0/a_dangling.png"; mkfifo "$tmp/bad/train/digit_0/b_fifo.png"
ln -s c_loop.jpg "$tmp/bad/train/digit_0/c_loop.jpg"; mkdir "$tmp/bad/train/digit_1/d_folder.jpeg"
timeout 30 "${train_bad[@]}" --dry-run >"$tmp/odd.out" 2>"$tmp/odd.err"; rc=$?
[ $rc -eq 0 ] && grep -q "left out 4 training entries named like an image that are no regular file (the first: .*digit_0/a_dangling.png: a dangling symbolic link)" "$tmp/odd.err" &&
    diff <(grep -i "samples" "$tmp/plain.out") <(grep -i "samples" "$tmp/odd.out") >/dev/null
rc=$?; ok "odd entries named like images: left out and counted ($(cat "$tmp/odd.err"))" $rc
[ "$fails" -eq 0 ]
