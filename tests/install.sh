#!/usr/bin/env bash
# cmake --install puts the library, header, program and cohort.pc under a prefix; a program built
# with nothing but `pkg-config --cflags --libs cohort` (the reference program A example) links and
# trains, and the installed cohort runs.
#   install.sh BUILD_DIR SOURCE_DIR DATA_ROOT
set -uo pipefail
build=$1 src=$2 data=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null || { echo "FAIL: cmake --install"; exit 1; }
pc=$(dirname "$(find "$tmp/prefix" -name cohort.pc | head -1)")
[ -n "$pc" ] || { echo "FAIL: no cohort.pc installed"; exit 1; }
export PKG_CONFIG_PATH=$pc
cc -std=c11 "$src/examples/lenet_two_devices.c" -o "$tmp/example" $(pkg-config --cflags --libs cohort) ||
    { echo "FAIL: the example does not build with pkg-config's flags"; exit 1; }
"$tmp/example" "$data/fashion-mnist" 1 512 | grep -q "^epoch 1, " || { echo "FAIL: the installed example did not train"; exit 1; }
"$tmp/prefix/bin/cohort" --version | grep -q "^cohort " || { echo "FAIL: the installed cohort does not run"; exit 1; }
echo "install: ok ($(pkg-config --modversion cohort), $(pkg-config --libs cohort))"
