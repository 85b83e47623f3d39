#!/bin/bash
# One call on the lent GPU machine: install carried wheels, then run each check capped, logs to $OUT.
# From the project root: bash tpu_tests/gpu-check.sh [quick|bands|scale]  (carry .whl: zarr, numcodecs, donfig,
# google-crc32c, dask, partd, locket for cp312; lazy-importer too where importlib_metadata is new enough to
# need it, as the TPU machine's was on 2026-12-06). Each step is capped so the whole call ends in ~7 min;
# "quick" (~1 min) runs only the jitted main job on both backends and tpu_tests/test_windows_hw.py.
# "bands" (~2 min) compares a product's tiles in bands of block rows with row-major, out of core.
# "scale" (~2 min) runs only issue 16's process scaling on the machine's CPU cores (no GPU): sum with 1,
# 2 and 4 jax.distributed processes on loopback, alternated in rounds (2 cores could not test it).
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=2
ROOT="$(pwd)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$ROOT"/.whl/*.whl > "$OUT/env.log" 2>&1
export PYTHONPATH=/tmp/site:$ROOT
SCR=/root/jaskscr; mkdir -p $SCR; export JASK_SCRATCH_DIR=$SCR/scratch
T0=$(date +%s); el(){ echo "== $1 at +$(( $(date +%s) - T0 ))s" | tee -a "$OUT/env.log"; }
{ el env; nvidia-smi -L; nproc
  python3 -c "import jax,jaxlib,zarr; print('jax',jax.__version__,'jaxlib',jaxlib.__version__,'zarr',zarr.__version__, jax.devices())"
  python3 -c "import jask; from jask import kernels; print('jask backend', kernels.backend_name())"; } >> "$OUT/env.log" 2>&1
if [ "${1:-}" = "quick" ]; then
  el demo; { for b in xla pallas; do echo "### backend=$b"; JASK_BACKEND=$b timeout 50 python3 -m jask.demo --data_dir=$SCR/demo --steps=5; echo "rc=$?"; done; } > "$OUT/demo.log" 2>&1
  el tpu_tests; timeout -s INT -k 20 70 python3 -m pytest tpu_tests/test_windows_hw.py -q -o addopts="" -p no:cacheprovider -rfE -s > "$OUT/tpu_tests.log" 2>&1; echo "rc=$?" >> "$OUT/tpu_tests.log"
  el done; exit 0
fi
if [ "${1:-}" = "bands" ]; then   # ~2 min: a product's tiles in bands against row-major (jask/exec/bands.py)
  el bands; { for b in xla pallas; do JASK_MEMORY_BUDGET=2GB timeout 100 python3 -m jask.bench.kernels --op=dot --n=8192 --block=1024 \
    --path=jask --backend=$b --bands=on,off --repeat=3 2>&1 | grep -E "ratio|^jax "; done; } > "$OUT/bands.log" 2>&1
  el done; exit 0
fi
if [ "${1:-}" = "scale" ]; then
  el scale; JAX_PLATFORMS=cpu timeout 200 python3 -m jask.bench --workload=sum --gib=0.5,2 --cache=warm --peers=raw-io \
    --repeat=5 --rounds=2 --processes=1,2,4 --budget=64MB --data_dir=$SCR/sd --out=$SCR/sout > "$OUT/scale.log" 2>&1
  echo "rc=$?" >> "$OUT/scale.log"; cp $SCR/sout/results.md "$OUT/scale_results.md" 2>/dev/null
  el done; exit 0
fi
el kernels
{ for b in xla pallas; do
    for spec in "dot float32" "add float32" "dot bfloat16"; do set -- $spec
      timeout 60 python3 -m jask.bench.kernels --op=$1 --dtype=$2 --n=8192 --block=1024 --backend=$b --repeat=5 2>&1 | grep -E "n=8192|Error|error" | tail -3
    done
  done; } > "$OUT/kernels.log" 2>&1
el tpu_tests; timeout -s INT -k 20 120 python3 -m pytest tpu_tests -q -o addopts="" -p no:cacheprovider -x -rfE -s -k "windows_hw or sweep" > "$OUT/tpu_tests.log" 2>&1; echo "rc=$?" >> "$OUT/tpu_tests.log"
el demo; { for b in xla pallas; do echo "### backend=$b"; JASK_BACKEND=$b timeout 60 python3 -m jask.demo --data_dir=$SCR/demo; echo "rc=$?"; done
  JASK_BACKEND=xla timeout 70 python3 -m jask.demo --data_dir=$SCR/demo2 --rows=8388608 --features=128 --budget=1GB --steps=3; echo "rc=$?"; } > "$OUT/demo.log" 2>&1
el bench; JASK_BACKEND=xla timeout 100 python3 -m jask.bench --workload=sum,grad --gib=2 --budget=2GB --repeat=2 --peers=jnp,raw-io --cache=warm --data_dir=$SCR/bd --out=$SCR/bout > "$OUT/bench.log" 2>&1; echo "rc=$?" >> "$OUT/bench.log"
cp $SCR/bout/results.md "$OUT/bench_results.md" 2>/dev/null
el tests; JASK_BACKEND=xla timeout -s INT -k 20 150 python3 -m pytest tests -q -o addopts="" -p no:cacheprovider -n 12 --maxfail=60 -rfE -m "not slow" > "$OUT/tests.log" 2>&1; echo "rc=$?" >> "$OUT/tests.log"
el done
