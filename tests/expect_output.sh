#!/usr/bin/env bash
# Run a command; pass only when it exits 0 AND its output (stdout and stderr) matches REGEX
# (Python syntax, . also matching newlines). ctest's PASS_REGULAR_EXPRESSION alone ignores the
# exit code, so an example could print its line and then fail.
#   expect_output.sh REGEX -- COMMAND...
set -uo pipefail
regex=$1; shift 2
out=$("$@" 2>&1); rc=$?
printf '%s\n' "$out"
if [ $rc -ne 0 ]; then echo "expect_output: exit status $rc"; exit 1; fi
printf '%s' "$out" | /usr/bin/python3 -c 'import re, sys; sys.exit(0 if re.search(sys.argv[1], sys.stdin.read(), re.S) else 1)' "$regex" \
    || { echo "expect_output: no match for /$regex/"; exit 1; }
