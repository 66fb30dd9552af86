#!/usr/bin/env bash
# Asks testbed.sh to change a capped worker's CPU share while it runs
# (TESTBED_CPU_CAP is this with its FIFOs' prefix):
#   cpu_cap_request.sh PREFIX NAME F
# Exit 0 once applied; 1 with the testbed's reason otherwise.
set -euo pipefail
[[ $# -eq 3 ]] || { echo "usage: $0 FIFO_PREFIX NAME SHARE" >&2; exit 2; }
prefix=$1
[[ -p $prefix.requests && -p $prefix.replies ]] || { echo "no CPU caps on this testbed" >&2; exit 1; }
echo "$2 $3" >"$prefix.requests"
read -r -t 30 reply <"$prefix.replies" || { echo "no answer from the testbed" >&2; exit 1; }
[[ $reply == ok ]] || { echo "$reply" >&2; exit 1; }
