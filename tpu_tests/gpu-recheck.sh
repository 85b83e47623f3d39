#!/bin/bash
# Short second call: the jitted main job and the window tests on the device, after the host-handle fix.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=2
ROOT="$(pwd)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$ROOT"/.whl/*.whl > "$OUT/env.log" 2>&1
export PYTHONPATH=/tmp/site:$ROOT
SCR=/root/jaskscr; mkdir -p $SCR; export JASK_SCRATCH_DIR=$SCR/scratch
T0=$(date +%s); el(){ echo "== $1 at +$(( $(date +%s) - T0 ))s" | tee -a "$OUT/env.log"; }
el demo; { for b in xla pallas; do echo "### backend=$b"; JASK_BACKEND=$b timeout 50 python3 -m jask.demo --data_dir=$SCR/demo --steps=5; echo "rc=$?"; done; } > "$OUT/demo.log" 2>&1
el tpu_tests; timeout 70 python3 -m pytest tpu_tests/test_windows_hw.py -q -o addopts="" -p no:cacheprovider -rfE -s > "$OUT/tpu_tests.log" 2>&1; echo "rc=$?" >> "$OUT/tpu_tests.log"
el done
