#!/usr/bin/env bash
# --plot and cohort plot: the SVG is well-formed XML, it renders with rsvg-convert, and the PNG is a
# chart (not blank: ink, and each curve's colour present); a comparison of two runs likewise; bad
# metrics files are one-line errors.
#   plot.sh COHORT DATA_ROOT
set -uo pipefail
cohort=$1 data=$2/fashion-mnist
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
command -v rsvg-convert >/dev/null || { echo "FAIL: rsvg-convert (librsvg2-bin) is not installed"; exit 1; }
fails=0
ok() { if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi; }
# The sanitizer pass (COHORT_SANITIZED=1) trains on a third of the samples: the charts' subject is
# the curves of 3 epochs, not how far they fall.
limit=2000 test_limit=500
if [ "${COHORT_SANITIZED:-0}" = 1 ]; then limit=640 test_limit=128; fi
T=(train --model lenet --data "$data" --train-limit $limit --test-limit $test_limit --epochs 3 -b 64 --lr 0.05
   --momentum 0.9 --no-progress)
"$cohort" "${T[@]}" --metrics "$tmp/one.jsonl" --plot "$tmp/one.svg" >/dev/null
rc=$?; ok "train --plot" $rc
"$cohort" "${T[@]}" --devices cpu:0,cpu:1 --metrics "$tmp/two.jsonl" >/dev/null
"$cohort" plot "$tmp/one.jsonl" "$tmp/two.jsonl" -o "$tmp/cmp.svg" --title "1 device vs 2"
rc=$?; ok "cohort plot of two runs" $rc
for svg in one cmp; do
    python3 -c 'import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1]).getroot(); assert r.tag.endswith("svg"), r.tag' "$tmp/$svg.svg"
    rc=$?; ok "$svg.svg is well-formed SVG" $rc
    grep -q "<polyline" "$tmp/$svg.svg" && grep -q "train loss" "$tmp/$svg.svg" && grep -q ">epoch<" "$tmp/$svg.svg"
    rc=$?; ok "$svg.svg has curves, a legend and an axis label" $rc
    rsvg-convert "$tmp/$svg.svg" -o "$tmp/$svg.png"
    rc=$?; ok "rsvg-convert renders $svg.svg" $rc
    python3 "$here/png_check.py" "$tmp/$svg.png" 1f77b4 d62728 2ca02c
    rc=$?; ok "$svg.png is a chart with all three curves" $rc
done
grep -q "lenet on \[cpu:0\], batch 64, lr 0.05" "$tmp/one.svg"
rc=$?; ok "the title names the model, devices, batch and lr" $rc
[ "$(grep -c "<circle" "$tmp/one.svg")" -eq 9 ]
rc=$?; ok "3 epochs x 3 curves = 9 points" $rc
printf 'not json\n' >"$tmp/bad.jsonl"
"$cohort" plot "$tmp/bad.jsonl" -o "$tmp/x.svg" 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "bad.jsonl:1: not a cohort metrics line" "$tmp/err" && [ ! -e "$tmp/x.svg" ]
rc=$?; ok "a bad metrics file: one line, exit 2, no chart" $rc
# Extreme values: a loss of 1.79e308 once looped forever writing ticks (the axis top overflowed to
# inf); a diverged epoch (loss null) is kept and left out of the chart; an absurd epoch is refused.
printf '{"epoch": 1, "loss": 1.79e308, "train_acc": 0.5, "test_acc": 0.5}\n{"epoch": 2, "loss": null, "train_acc": 0.1, "test_acc": 0.1}\n' >"$tmp/huge.jsonl"
timeout 20 "$cohort" plot "$tmp/huge.jsonl" -o "$tmp/huge.svg"; rc=$?
[ $rc -eq 0 ] && [ "$(wc -c <"$tmp/huge.svg")" -lt 100000 ] && rsvg-convert "$tmp/huge.svg" -o "$tmp/huge.png"
rc=$?; ok "a loss of 1.79e308 and a null loss: a small chart that renders, promptly" $rc
printf '{"epoch": 1e300, "loss": 1}\n' >"$tmp/epoch.jsonl"
timeout 20 "$cohort" plot "$tmp/epoch.jsonl" -o "$tmp/x.svg" 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "epoch.jsonl:1: not a cohort metrics line" "$tmp/err"
rc=$?; ok "epoch 1e300: one line, exit 2" $rc
[ "$fails" -eq 0 ]
