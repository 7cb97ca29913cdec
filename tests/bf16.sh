#!/usr/bin/env bash
# --precision bf16 end to end, on a subset of real Fashion-MNIST, with resnet18 (19 of its 20
# convolutions multiply in bf16: the stride-2 3x3 layers directly, the stride-1 3x3 layers in
# Winograd's point products, the 1x1 stride-2 shortcuts as bf16 GEMMs; the stem stays fp32):
#  - 2 epochs straight == 1 epoch, stop, --resume for 1 more: bit-identical model and optimizer
#    files (1 device and 2 devices);
#  - the checkpoint holds fp32 tensors under PyTorch's names, not fp32 training's bits (bf16 took
#    effect), and it learns as fp32 does: epoch 2's training accuracy >= 0.55 and within 10 points
#    of fp32's (chance is 0.10). 32 steps of 64 are noisy: over seeds 1-5 on an Intel family 6
#    model 207 bf16 trailed or led fp32 by 1.6, 1.0, 6.4, 7.6 and 4.1 points (5 points, the bound
#    before, failed seed 3, this test's, there; on a Zen 5 it had given 0.6475 against 0.6377); a
#    broken bf16 step stays near chance. Not the test accuracy: with BatchNorm's
#    running statistics after 32 steps it swings between epochs (fp32 0.47, 0.38, 0.49; bf16 0.37,
#    0.33, 0.55);
#  - a graph model (--model resnet.onnx, exported by PyTorch) trains in bf16 as in fp32;
#  - cohort eval, which computes in fp32, reports that checkpoint's accuracy within 2 points of what
#    training reported in bf16; cohort eval --precision bf16 reports training's own figure.
# Exits 77 (ctest: skipped, never passed) on a CPU without native bf16, where --precision bf16 is
# refused (cli_errors checks that line).
#   bf16.sh COHORT DATA_ROOT
set -uo pipefail
cohort=$1 data=$2/fashion-mnist
if ! "$cohort" info | grep -q '^bf16: *native'; then
    echo "skipped: no native bf16 here ($("$cohort" info | grep '^bf16:'))"
    exit 77
fi
# bf16 products on every CPU with native bf16, also where --precision bf16 would keep fp32 ones
# (Intel without AMX: ch_cpu_bf16_products); the last checks below run the other setting.
export COHORT_BF16_PRODUCTS=on
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
ok() { if [ "$2" -eq 0 ]; then passes=$((passes + 1)); else echo "FAIL: $1"; fails=$((fails + 1)); fi; }
same() { cmp -s "$1/model.safetensors" "$2/model.safetensors" && cmp -s "$1/optimizer.safetensors" "$2/optimizer.safetensors"; }
# near A B MIN D: training accuracies A (bf16) and B (fp32) read, A >= MIN and |A - B| <= D.
near() { awk -v a="$1" -v b="$2" -v min="$3" -v d="$4" 'BEGIN { x = a - b; if (x < 0) x = -x; exit !(a != "" && b != "" && a >= min && x <= d) }'; }

A=(train --model resnet18 --data "$data" --train-limit 1024 --test-limit 512 -b 64 --lr 0.05 --momentum 0.9
   --seed 3 --no-progress --threads 2)

for devs in cpu:0 cpu:0,cpu:1; do
    c=$tmp/$devs
    "$cohort" "${A[@]}" --devices $devs --precision bf16 --epochs 2 --checkpoint-dir "$c/straight" >"$c.out"
    "$cohort" "${A[@]}" --devices $devs --precision bf16 --epochs 1 --checkpoint-dir "$c/split" >/dev/null
    "$cohort" "${A[@]}" --devices $devs --precision bf16 --epochs 2 --checkpoint-dir "$c/split" --resume >/dev/null
    same "$c/straight/epoch-0002" "$c/split/epoch-0002"
    rc=$?; ok "[$devs] bf16: 2 epochs == 1 + resume 1: bit-identical" $rc
done

c=$tmp/cpu:0
acc=$(sed -n 's/^epoch 2,.*test acc \([0-9.]*\),.*/\1/p' "$c.out")
"$cohort" "${A[@]}" --precision fp32 --epochs 2 --checkpoint-dir "$tmp/fp32" >"$tmp/fp32.out"
tr16=$(sed -n 's/^epoch 2,.*train acc \([0-9.]*\),.*/\1/p' "$c.out")
tr32=$(sed -n 's/^epoch 2,.*train acc \([0-9.]*\),.*/\1/p' "$tmp/fp32.out")
near "$tr16" "$tr32" 0.55 0.10
rc=$?; ok "bf16 learns as fp32 does: epoch 2's train acc $tr16 >= 0.55, fp32's $tr32" $rc
! cmp -s "$tmp/fp32/epoch-0002/model.safetensors" "$c/straight/epoch-0002/model.safetensors" &&
    [ "$(stat -c %s "$tmp/fp32/epoch-0002/model.safetensors")" = "$(stat -c %s "$c/straight/epoch-0002/model.safetensors")" ] &&
    head -c 65536 "$c/straight/epoch-0002/model.safetensors" >"$tmp/header" &&
    grep -aq 'resnet_block2\.0\.conv1\.weight' "$tmp/header" && ! grep -aq '"BF16"' "$tmp/header"
rc=$?; ok "the bf16 checkpoint: fp32 tensors under PyTorch's names, the same size as fp32's, other bits" $rc

got=$("$cohort" eval --checkpoint "$c/straight" --data "$data" --test-limit 512 2>&1 | sed -n 's/^test loss .*, test acc \([0-9.]*\) .*/\1/p')
awk -v a="$acc" -v b="$got" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b != "" && d <= 0.02) }'
rc=$?; ok "cohort eval (fp32) of the bf16 checkpoint: $got, training (bf16) said $acc" $rc

# Told --precision bf16, eval multiplies in bf16 as training's own test pass did: the same accuracy,
# on the same samples and device, and the line says so (the default line does not).
line=$("$cohort" eval --checkpoint "$c/straight" --data "$data" --test-limit 512 --precision bf16 2>&1)
got16=$(echo "$line" | sed -n 's/^test loss .*, test acc \([0-9.]*\) .*/\1/p')
[ "$got16" = "$acc" ] && echo "$line" | grep -q ', bf16 products$' &&
    ! "$cohort" eval --checkpoint "$c/straight" --data "$data" --test-limit 512 2>&1 | grep -q 'bf16'
rc=$?; ok "cohort eval --precision bf16: $got16, training (bf16) said $acc; only this line says bf16" $rc

# COHORT_BF16_PRODUCTS=off: no layer multiplies in bf16 and the plan says why; the BatchNorm inputs
# stay bf16. Its eval line says the products were fp32.
# (Outputs go to files or variables first: under pipefail, a "| grep -q" that exits at its match
# can fail the writer with SIGPIPE, and the check with it.)
plan=$(COHORT_BF16_PRODUCTS=off "$cohort" "${A[@]}" --precision bf16 --dry-run 2>&1)
grep -q 'bf16 products in 0 of 20 convolutions' <<<"$plan" &&
    grep -q '^  products stay fp32 here: COHORT_BF16_PRODUCTS=off' <<<"$plan" &&
    grep -q 'BatchNorm inputs kept in bf16' <<<"$plan" &&
    "$cohort" "${A[@]}" --precision bf16 --dry-run >"$tmp/plan_on" 2>&1 &&
    grep -q 'bf16 products in 19 of 20 convolutions' "$tmp/plan_on"
rc=$?; ok "COHORT_BF16_PRODUCTS=off: 0 of 20 convolutions in bf16, and why; on: 19 of 20" $rc
# The BatchNorm + ReLU outputs passed in bf16 to the Winograd convolutions that read them (resnet18's
# 8 bn1 outputs at 28x28: 64 x 784 x 2 + 128 x 196 x 2 + 256 x 49 x 2 + 512 x 16 x 2 values a sample,
# 192000 x 64 x 2 bytes = 23.44 MiB a batch of 64), and none with COHORT_BF16_INPUTS=off.
plan=$(COHORT_BF16_INPUTS=off "$cohort" "${A[@]}" --precision bf16 --dry-run 2>&1)
grep -q 'BatchNorm + ReLU outputs passed in bf16 to the convolutions that read them (23.44 MiB a batch)' "$tmp/plan_on" &&
    ! grep -q 'outputs passed in bf16' <<<"$plan"
rc=$?; ok "bn1 outputs passed in bf16 to conv2: 23.44 MiB a batch of 64; none with COHORT_BF16_INPUTS=off" $rc
line=$(COHORT_BF16_PRODUCTS=off "$cohort" eval --checkpoint "$c/straight" --data "$data" --test-limit 64 --precision bf16 2>&1)
grep -q ', --precision bf16 (products fp32 here)$' <<<"$line"
rc=$?; ok "cohort eval --precision bf16 with fp32 products says so" $rc

# A graph model (--model FILE.onnx: graph_parity.py's resnet, exported by PyTorch) in bf16: the
# layers with 16 channels or more multiply in bf16 (4 of its 9 convolutions), and it learns as fp32
# does: epoch 2's training accuracy within 3 points of fp32's (seen 0.3 and 0.4 over seeds 1 and 2;
# chance is 0.10), other bits.
/usr/bin/python3 "$(dirname "$0")/graph_parity.py" export "$tmp" >/dev/null
G=(train --model "$tmp/resnet.onnx" --data "$data" --train-limit 6000 --test-limit 500 -b 64 --lr 0.05 --epochs 2
   --seed 1 --no-progress --threads 2)
"$cohort" "${G[@]}" --precision bf16 --dry-run >"$tmp/g_plan" 2>&1 &&
    grep -q 'bf16 products in 4 of 9 convolutions' "$tmp/g_plan" &&
    "$cohort" "${G[@]}" --precision bf16 --checkpoint-dir "$tmp/g16" >"$tmp/g16.out" 2>&1 &&
    "$cohort" "${G[@]}" --checkpoint-dir "$tmp/g32" >"$tmp/g32.out" 2>&1 &&
    ! cmp -s "$tmp/g16/epoch-0002/model.safetensors" "$tmp/g32/epoch-0002/model.safetensors"
rc=$?
g16=$(sed -n 's/^epoch 2,.*train acc \([0-9.]*\),.*/\1/p' "$tmp/g16.out" 2>/dev/null)
g32=$(sed -n 's/^epoch 2,.*train acc \([0-9.]*\),.*/\1/p' "$tmp/g32.out" 2>/dev/null)
[ $rc -eq 0 ] && near "$g16" "$g32" 0.5 0.03
rc=$?; ok "resnet.onnx in bf16 (4 of 9 convolutions): epoch 2's train acc $g16, fp32's $g32, other bits" $rc

echo "bf16: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
