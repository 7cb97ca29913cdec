#!/usr/bin/env bash
# Bad input on the command line: one line naming the problem on stderr, exit code 2, no crash.
set -uo pipefail
cohort=$1 data=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0

expect() { # code needle -- command...
    local code=$1 needle=$2; shift 3
    "$@" >"$tmp/out" 2>"$tmp/err"; local got=$?
    # (ASan, in the sanitizer pass, notes the refused impossible allocation on a line of its own.)
    local lines; lines=$(grep -cv 'WARNING: AddressSanitizer failed to allocate' "$tmp/err")
    if [ "$got" -ne "$code" ] || { [ -n "$needle" ] && ! grep -qF -- "$needle" "$tmp/err"; } ||
       { [ "$code" -ne 0 ] && [ "$lines" -ne 1 ]; }; then
        echo "FAIL: $* -> exit $got (want $code and '$needle'), stderr:"; cat "$tmp/err"; fails=$((fails + 1))
    else
        passes=$((passes + 1))
    fi
}

mkdir -p "$tmp/ok"
cp "$data"/mnist/*.gz "$tmp/ok/"
T=(train --model mlp --epochs 1 --train-limit 200 --test-limit 100)
# Without --train-limit, for damage past the first 200 samples (a limit reads no further).
TN=(train --model mlp --epochs 1 --test-limit 100)

expect 2 "unknown command 'trian'" -- "$cohort" trian
expect 2 "unknown or incomplete option" -- "$cohort" train --model lenet --data "$tmp/ok" --bogus
expect 2 "unknown or incomplete option" -- "$cohort" train --model lenet --data
expect 2 "--epochs 'abc'" -- "$cohort" train --model lenet --data "$tmp/ok" --epochs abc
expect 2 "--lr '-1'" -- "$cohort" train --model lenet --data "$tmp/ok" --lr -1
expect 2 "--batch-size '0'" -- "$cohort" train --model lenet --data "$tmp/ok" -b 0
expect 2 "--threads '2x'" -- "$cohort" train --model lenet --data "$tmp/ok" --threads 2x
expect 2 "are required" -- "$cohort" train --model lenet
expect 2 "unknown model 'vgg'" -- "$cohort" train --model vgg --data "$tmp/ok"
expect 2 "--init 'uniform'" -- "$cohort" train --model lenet --data "$tmp/ok" --init uniform
expect 2 "nowhere: no such directory" -- "$cohort" train --model lenet --data "$tmp/nowhere"
# A link loop says so (it was "no such directory"), for --data and --checkpoint-dir alike (one check,
# ch_file_check_dir); a file is not taken for the folder.
ln -s loop "$tmp/loop"
expect 2 "loop: cannot read (Too many levels of symbolic links)" -- "$cohort" train --model lenet --data "$tmp/loop"
expect 2 "train-images-idx3-ubyte.gz: not a directory (a file)" -- "$cohort" train --model lenet --data "$tmp/ok/train-images-idx3-ubyte.gz"
expect 2 "--checkpoint-dir $tmp/loop: cannot read (Too many levels of symbolic links)" -- "$cohort" train --model lenet --data "$tmp/ok" --checkpoint-dir "$tmp/loop"
expect 2 "cpu:0 is listed twice" -- "$cohort" train --model lenet --data "$tmp/ok" --devices cpu:0,cpu:0
# A GPU asked for where there is none (no driver, or none visible): one line, exit 2; the plugin
# missing or broken: the same, with dlopen's reason; mixed kinds and the wrong name, before anything loads.
expect 2 "cuda:0: no usable GPU" -- env CUDA_VISIBLE_DEVICES= "$cohort" train --model lenet --data "$tmp/ok" --devices cuda:0
expect 2 "cuda:0: no usable GPU" -- env CUDA_VISIBLE_DEVICES= "$cohort" train --model lenet --data "$tmp/ok" --devices cuda:local
expect 2 "devices 'cuda:localx': device index must be 0..63 or local" -- "$cohort" train --model lenet --data "$tmp/ok" --devices cuda:localx
: >"$tmp/broken.so"
expect 2 "cannot load the CUDA plugin: $tmp/broken.so" -- env COHORT_CUDA_PLUGIN="$tmp/broken.so" "$cohort" train --model lenet --data "$tmp/ok" --devices cuda*2
expect 2 "cpu and cuda devices in one list" -- "$cohort" train --model lenet --data "$tmp/ok" --devices cpu:0,cuda:0
expect 2 "GPUs are named cuda:K" -- "$cohort" train --model lenet --data "$tmp/ok" --devices gpu:0
expect 2 "expected entries like cpu:0" -- "$cohort" train --model lenet --data "$tmp/ok" --devices 2
expect 2 "--bucket-mb '0'" -- "$cohort" train --model lenet --data "$tmp/ok" --bucket-mb 0
expect 2 "--accum-steps '0'" -- "$cohort" train --model lenet --data "$tmp/ok" --accum-steps 0
expect 2 "--accum-steps '1e9'" -- "$cohort" train --model lenet --data "$tmp/ok" --accum-steps 1e9
expect 2 "--precision 'fp16': expected fp32 or bf16" -- "$cohort" train --model lenet --data "$tmp/ok" --precision fp16
expect 2 "--grad-compress 'fp8': expected none, bf16 or bf16-ef" -- "$cohort" train --model lenet --data "$tmp/ok" --grad-compress fp8
expect 2 "--zero '2': expected an integer in 0..1" -- "$cohort" train --model lenet --data "$tmp/ok" --zero 2
# The largest bound printed as the largest long, not as the double it is kept in (2^63).
expect 2 "--seed '9223372036854775808': expected an integer in 0..9223372036854775807" -- "$cohort" train --model lenet --data "$tmp/ok" --seed 9223372036854775808
expect 2 "--train-limit '0': expected an integer in 1..9223372036854775807" -- "$cohort" train --model lenet --data "$tmp/ok" --train-limit 0
expect 2 "--progress 'fancy': expected auto, bar, lines or none" -- "$cohort" train --model lenet --data "$tmp/ok" --progress fancy
expect 2 "--shares '0': expected auto or one whole number" -- "$cohort" train --model lenet --data "$tmp/ok" --shares 0
expect 2 "--shares '3,x'" -- "$cohort" train --model lenet --data "$tmp/ok" --shares 3,x
expect 2 "--shares '3,1': more shares than the job's 1 rank" -- "$cohort" train --model lenet --data "$tmp/ok" --shares 3,1
expect 2 "--shares '9999999999999'" -- "$cohort" train --model lenet --data "$tmp/ok" --shares 9999999999999
# Empty and blank-led values: refused alike by every numeric flag and --shares (--shares "" once
# meant no shares, and --accum-steps " 2" was read as 2 while --shares " 2" was refused).
expect 2 "--shares '': expected auto" -- "$cohort" train --model lenet --data "$tmp/ok" --shares ""
expect 2 "--accum-steps '': expected an integer" -- "$cohort" train --model lenet --data "$tmp/ok" --accum-steps ""
expect 2 "--accum-steps ' 2': expected an integer" -- "$cohort" train --model lenet --data "$tmp/ok" --accum-steps " 2"
expect 2 "--shares ' 2': expected auto" -- "$cohort" train --model lenet --data "$tmp/ok" --shares " 2"
expect 2 "--lr ' 0.1': expected a number" -- "$cohort" train --model lenet --data "$tmp/ok" --lr " 0.1"
# --precision bf16: one line and exit 2 on a CPU without native bf16; where it is native, it trains.
if "$cohort" info | grep -q '^bf16: *native'; then
    expect 0 "" -- "$cohort" "${T[@]}" --data "$tmp/ok" --precision bf16
    expect 2 "COHORT_BF16_PRODUCTS='yes': expected on, off or auto" -- env COHORT_BF16_PRODUCTS=yes "$cohort" "${T[@]}" --data "$tmp/ok" --precision bf16
    expect 2 "COHORT_BF16_INPUTS='0': expected on, off or auto" -- env COHORT_BF16_INPUTS=0 "$cohort" "${T[@]}" --data "$tmp/ok" --precision bf16
else
    expect 2 "--precision bf16 needs a CPU with native bf16" -- "$cohort" train --model lenet --data "$tmp/ok" --precision bf16
fi
# On cuda devices --precision bf16 is refused on every host, before any GPU is looked for: the plugin
# has no bf16 kernels, and the host CPU's bf16 is not what would run. Eval and bench train alike.
expect 2 "--precision bf16: the CUDA plugin has no bf16 kernels yet" -- "$cohort" "${T[@]}" --data "$tmp/ok" --devices cuda:0 --precision bf16
expect 2 "--precision bf16: the CUDA plugin has no bf16 kernels yet" -- "$cohort" bench train --model lenet --devices cuda:0 --precision bf16 --steps 1
# COHORT_BF16=emulate (for tests): oneDNN's emulation of bf16 stands in where the CPU has AVX-512
# and no bf16, and it trains; any other value is refused, on every CPU.
expect 2 "COHORT_BF16='later': expected emulate (or unset)" -- env COHORT_BF16=later "$cohort" "${T[@]}" --data "$tmp/ok" --precision bf16
if "$cohort" info | grep -q "^bf16: *not native.*effective ISA: avx512"; then
    expect 0 "" -- env COHORT_BF16=emulate "$cohort" "${T[@]}" --data "$tmp/ok" --precision bf16
fi

# A file name with a newline in it: still one line (escaped).
mkdir -p "$tmp/new
line"
expect 2 'new\nline: no data set found' -- "$cohort" "${T[@]}" --data "$tmp/new
line"
expect 2 "--normalize: the mean 'nan' holds nan" -- "$cohort" "${T[@]}" --data "$tmp/ok" --normalize nan/1
expect 2 "--normalize: the mean 'a' needs 1 number" -- "$cohort" "${T[@]}" --data "$tmp/ok" --normalize a/b
expect 2 "--init 'normal:1e308'" -- "$cohort" "${T[@]}" --data "$tmp/ok" --init normal:1e308
"$cohort" "${T[@]}" --data "$tmp/ok" --epochs 0 >"$tmp/out" 2>&1
grep -q "^cohort train: --epochs 0: nothing to train" "$tmp/out"; rc=$?
if [ $rc -eq 0 ]; then passes=$((passes + 1)); else echo "FAIL: --epochs 0: $(cat "$tmp/out")"; fails=$((fails + 1)); fi

# The same flag means the same everywhere, and every subcommand answers --help.
for sub in train eval export plot info bench "bench train" "bench allreduce" "bench loader" help; do
    expect 0 "" -- "$cohort" $sub --help
done
expect 0 "" -- "$cohort" bench allreduce --devices cpu:0,cpu:1 --max-bytes 4096
expect 0 "" -- "$cohort" bench allreduce --devices 'cpu*3' --max-bytes 4096
expect 0 "" -- "$cohort" bench train --model linear -b 32 --steps 2 --warmup 0
# --schedule cosine without --t-max anneals over --epochs (CosineAnnealingLR(T_max=epochs)).
rm -f "$tmp/cos.jsonl"
"$cohort" "${T[@]}" --data "$tmp/ok" --epochs 2 --lr 0.1 --schedule cosine --no-progress --metrics "$tmp/cos.jsonl" >/dev/null 2>&1
if [ "$(grep -o '"lr": [0-9.e-]*' "$tmp/cos.jsonl" | cut -d' ' -f2 | tr '\n' ' ')" = "0.1 0.05 " ]; then
    passes=$((passes + 1)); else echo "FAIL: cosine without --t-max:"; cat "$tmp/cos.jsonl"; fails=$((fails + 1)); fi

# Inputs that are not regular files: a FIFO would block forever, a directory is no file.
mk() { rm -rf "$tmp/bad"; mkdir -p "$tmp/bad"; cp "$tmp/ok"/*.gz "$tmp/bad/"; }
mk; rm "$tmp/bad/train-images-idx3-ubyte.gz"; mkfifo "$tmp/bad/train-images-idx3-ubyte"
expect 2 "train-images-idx3-ubyte: is a FIFO, expected a file" -- timeout 20 "$cohort" "${T[@]}" --data "$tmp/bad"
mk; rm "$tmp/bad/train-images-idx3-ubyte.gz"; mkdir "$tmp/bad/train-images-idx3-ubyte"
expect 2 "train-images-idx3-ubyte: is a directory, expected a file" -- timeout 20 "$cohort" "${T[@]}" --data "$tmp/bad"
# An IDX header that claims 2^28 images costs only what the file holds, and --train-limit reads
# only what it keeps.
mk; printf '\x00\x00\x08\x03\x10\x00\x00\x00\x00\x00\x00\x1c\x00\x00\x00\x1c' | cat - <(head -c 100000 /dev/zero) | gzip > "$tmp/bad/train-images-idx3-ubyte.gz"
expect 2 "truncated: 210453397504 data bytes declared, the file holds fewer" -- timeout 30 "$cohort" "${TN[@]}" --data "$tmp/bad"
mk; gzip -dc "$tmp/ok/train-images-idx3-ubyte.gz" | head -c 1000000 | gzip > "$tmp/bad/train-images-idx3-ubyte.gz"
expect 0 "" -- timeout 60 "$cohort" "${T[@]}" --data "$tmp/bad" --no-progress
# Outputs are checked before anything is trained: a bad path is exit 2 at once, and nothing that
# is not a regular file is ever replaced (a FIFO is refused, a device is written straight to).
touch "$tmp/afile"; mkfifo "$tmp/fifo"
expect 2 "--checkpoint-dir $tmp/afile: not a directory" -- "$cohort" "${T[@]}" --data "$tmp/ok" --checkpoint-dir "$tmp/afile"
expect 2 "--plot /nonexistent/x.svg: the folder /nonexistent does not exist" -- "$cohort" "${T[@]}" --data "$tmp/ok" --plot /nonexistent/x.svg
expect 2 "--plot $tmp: is a directory" -- "$cohort" "${T[@]}" --data "$tmp/ok" --plot "$tmp"
expect 2 "--trace $tmp/fifo: is a FIFO" -- timeout 20 "$cohort" "${T[@]}" --data "$tmp/ok" --trace "$tmp/fifo"
expect 2 "--metrics $tmp: is a directory" -- "$cohort" "${T[@]}" --data "$tmp/ok" --metrics "$tmp"
[ -p "$tmp/fifo" ] && [ -f "$tmp/afile" ]; rc=$?
if [ $rc -eq 0 ]; then passes=$((passes + 1)); else echo "FAIL: the FIFO or the file was replaced"; fails=$((fails + 1)); fi
"$cohort" "${T[@]}" --data "$tmp/ok" --no-progress --plot /dev/null --checkpoint-dir "$tmp/ck" >/dev/null 2>&1
[ $? -eq 0 ] && [ -c /dev/null ]; rc=$?
if [ $rc -eq 0 ]; then passes=$((passes + 1)); else echo "FAIL: --plot /dev/null: /dev/null is no longer a device"; fails=$((fails + 1)); fi
expect 2 "--out $tmp: is a directory" -- "$cohort" export --checkpoint "$tmp/ck" --out "$tmp"
expect 2 "--out $tmp/fifo: is a FIFO" -- timeout 20 "$cohort" export --checkpoint "$tmp/ck" --out "$tmp/fifo"
expect 0 "" -- "$cohort" export --checkpoint "$tmp/ck" --out /dev/null
[ -c /dev/null ] && [ -p "$tmp/fifo" ]; rc=$?
if [ $rc -eq 0 ]; then passes=$((passes + 1)); else echo "FAIL: export replaced /dev/null or the FIFO"; fails=$((fails + 1)); fi
# eval's --precision: checked as train's, and bf16 refused (one line, exit 2) without native bf16.
expect 2 "--precision 'fp16': expected fp32 or bf16" -- "$cohort" eval --checkpoint "$tmp/ck" --data "$tmp/ok" --precision fp16
if "$cohort" info | grep -q '^bf16: *native'; then
    expect 0 "" -- "$cohort" eval --checkpoint "$tmp/ck" --data "$tmp/ok" --precision bf16
else
    expect 2 "--precision bf16 needs a CPU with native bf16" -- "$cohort" eval --checkpoint "$tmp/ck" --data "$tmp/ok" --precision bf16
fi

# A replica that fails stops the whole run with one line naming it: never a hang (timeout: 124).
P=("${T[@]}" --data "$tmp/ok" --devices 'cpu*3' --batch-size 30 --no-progress)
expect 1 "step 2: injected fault on cpu:1" -- env COHORT_INJECT_FAULT=error:1:2 timeout 60 "$cohort" "${P[@]}"
expect 1 "step 3: the loss is nan on cpu:2" -- env COHORT_INJECT_FAULT=nan:2:3 timeout 60 "$cohort" "${P[@]}" --nan-check
expect 1 "cpu:1: allocation of replica batch buffers failed" -- env COHORT_INJECT_FAULT=alloc:1 timeout 60 "$cohort" "${P[@]}"

# Malformed data sets.
mk() { rm -rf "$tmp/bad"; mkdir -p "$tmp/bad"; cp "$tmp/ok"/*.gz "$tmp/bad/"; }
mk; gzip -dc "$tmp/ok/train-images-idx3-ubyte.gz" | head -c 100000 | gzip > "$tmp/bad/train-images-idx3-ubyte.gz"
expect 2 "truncated" -- "$cohort" "${T[@]}" --data "$tmp/bad"
mk; head -c 50000 "$tmp/ok/train-images-idx3-ubyte.gz" > "$tmp/bad/train-images-idx3-ubyte.gz"
expect 2 "train-images-idx3-ubyte.gz" -- "$cohort" "${TN[@]}" --data "$tmp/bad"
mk; { printf '\x00\x00\x08\x03'; gzip -dc "$tmp/ok/train-labels-idx1-ubyte.gz" | tail -c +5; } | gzip > "$tmp/bad/train-labels-idx1-ubyte.gz"
expect 2 "bad magic" -- "$cohort" "${T[@]}" --data "$tmp/bad"
mk; printf '\x00\x00\x08\x01\x00\x00\x23\x28' | cat - <(gzip -dc "$tmp/ok/t10k-labels-idx1-ubyte.gz" | tail -c +9 | head -c 9000) | gzip > "$tmp/bad/t10k-labels-idx1-ubyte.gz"
expect 2 "9000 labels, but" -- "$cohort" "${T[@]}" --data "$tmp/bad"
mk; { gzip -dc "$tmp/ok/t10k-labels-idx1-ubyte.gz" | head -c 8; printf '\x0c'; gzip -dc "$tmp/ok/t10k-labels-idx1-ubyte.gz" | tail -c +10; } | gzip > "$tmp/bad/t10k-labels-idx1-ubyte.gz"
expect 2 "label 12 of sample 0" -- "$cohort" "${T[@]}" --data "$tmp/bad"
mk; : > "$tmp/bad/t10k-images-idx3-ubyte.gz"
expect 2 "t10k-images-idx3-ubyte.gz" -- "$cohort" "${T[@]}" --data "$tmp/bad"

# What works still works: help, version, info, a tiny run.
expect 0 "" -- "$cohort" --version
expect 0 "" -- "$cohort" train --help
expect 0 "" -- "$cohort" info
expect 0 "" -- "$cohort" "${T[@]}" --data "$tmp/ok" --no-progress
# --dry-run: the summary (lenet is ~13.7 MFLOP per training image, 129068 parameters), no training.
"$cohort" train --model lenet --data "$tmp/ok" --devices cpu:0,cpu:1 --dry-run >"$tmp/out" 2>&1
if [ $? -eq 0 ] && grep -q "total: 129068 parameters" "$tmp/out" && grep -q "training ~13.661 MFLOP/image" "$tmp/out" &&
   grep -q "global batch 256 -> 128 to 128 per replica; 235 steps per epoch (last batch 96)" "$tmp/out" &&
   ! grep -q "^epoch" "$tmp/out"; then passes=$((passes + 1)); else echo "FAIL: --dry-run:"; cat "$tmp/out"; fails=$((fails + 1)); fi
# The schedule reaches the optimizer: the metrics' lr per epoch, step decay by half each epoch after
# one warmup epoch, with the linear scaling rule (batch 128: lr 0.2 -> 0.1).
rm -f "$tmp/lr.jsonl"
"$cohort" "${T[@]}" --data "$tmp/ok" --epochs 4 -b 128 --lr 0.2 --scale-lr --schedule step --step-size 1 \
    --gamma 0.5 --warmup-epochs 1 --no-progress --metrics "$tmp/lr.jsonl" >/dev/null 2>&1
if [ "$(grep -o '"lr": [0-9.e-]*' "$tmp/lr.jsonl" | cut -d' ' -f2 | tr '\n' ' ')" = "0.1 0.1 0.05 0.025 " ]; then
    passes=$((passes + 1)); else echo "FAIL: schedule in training:"; cat "$tmp/lr.jsonl"; fails=$((fails + 1)); fi
expect 2 "--milestones '3,2'" -- "$cohort" train --model lenet --data "$tmp/ok" --schedule multistep --milestones 3,2
expect 2 "unknown optimizer 'rmsprop'" -- "$cohort" train --model lenet --data "$tmp/ok" --optimizer rmsprop

# The manual page says --model takes your own model as an ONNX file (it once listed the zoo only).
manual=$("$cohort" help train)
[[ $manual == *"--model NAME|FILE.onnx"* && $manual == *"training mode"* ]]
rc=$?; if [ $rc -eq 0 ]; then passes=$((passes + 1)); else echo "FAIL: cohort help train does not say --model takes FILE.onnx"; fails=$((fails + 1)); fi
# Every flag of `cohort train --help` is in the manual page and in the first column of the
# README's flag table.
readme=$(dirname "$0")/../README.md
page=$("$cohort" help train)
for flag in $("$cohort" train --help | grep -oE -- '--[a-z][a-z-]+' | sort -u); do
    if [[ $page == *"$flag"* ]] && grep -qE -- "^\| [^|]*${flag}[] ,\`]" "$readme"; then passes=$((passes + 1))
    else echo "FAIL: $flag is missing from cohort help train or the README's flag table"; fails=$((fails + 1)); fi
done
echo "cli_errors: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
