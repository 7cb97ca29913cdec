#!/usr/bin/env bash
# Each graph of graph_models.c learns Fashion-MNIST: 3 epochs on 12000 images on two devices, test
# accuracy on 2000 (measured 0.84, 0.71, 0.77, 0.76; chance is 0.10; a broken op or gradient stays far below the thresholds).
set -euo pipefail
bin=$1 data=$2
for spec in resnet:0.78 mobilenet:0.62 densenet:0.70 lognet:0.70; do
    "$bin" learn "$data" "${spec%%:*}" "${spec##*:}"
done
