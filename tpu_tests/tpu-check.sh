#!/bin/bash
# One call on the lent TPU machine (tpu-v5e: Python 3.11, jax 0.10.2 + libtpu installed, no zarr, no
# network): install the carried wheels, then run each check capped, logs to $OUT.
# From the project root: bash tpu_tests/tpu-check.sh [STEPS]   carry: [".whl-tpu"]
# STEPS is a comma list of env,hw,kernels,demo,bench,tests (default all, about 17 minutes capped: split it over
# two calls, e.g. env,hw,kernels,demo then bench,tests). Also grad: the grad workload at 1 GiB (GRAD_CAP, 240 s). Also: probe (tpu_tests/transfer_probe.py: reads,
# host-to-device copies, jask.sum on chip and host, jit(value_and_grad) bytes), tests1 (the whole CPU suite but
# test_kernels/test_ops/test_properties, 420 s cap; TESTS1_FILES and TESTS1_CAP change them) and tests2 (test_ops and
# test_kernels, 400 s cap; TESTS2_CAP, TESTS2_FILES: 385 of their 695 tests fit in 440 s on 2026-12-06, so run
# them one file per call).
# Also: scale (issue 16's process scaling on the machine's 13 CPU cores, no TPU: sum with 1, 2 and 4 processes in
# alternated rounds, SCALE_CAP 240 s; needs loopback TCP, which the TPU machine's sandbox refused on 2026-12-06) and
# split (tpu_tests/split_probe.py: 1, 2, 4 independent processes summing shares of 2 GiB, no TCP needed).
# Also: compile (tpu_tests/compile_probe.py: the first calls of jit(grad) of the grad workload at 1 GiB, what JAX
# spends tracing, lowering and compiling, backends auto and xla, COMPILE_CAP 150 s each).
# Also: stack (tpu_tests/stack_probe.py: joined windows with tiles stacked on the chip against the earlier per-program
# calls with host-stacked tiles, sum and jit(value_and_grad) at 1 GiB, alternated, STACK_CAP 200 s).
# Also: bands (a product's tiles in bands of block rows against row-major, the whole pipeline from Zarr stores,
# n=8192 in tiles of 1024, budget 2GB: 1.5 GiB read against 2.5 GiB row-major; bytes and time, BANDS_CAP 240 s).
# Also: lse (tpu_tests/lse_probe.py: jask's logsumexp/softmax against float64 beside jax.nn on the chip and the host,
# the chip's exp/log/log1p in ulps; tpu_tests/fold_probe.py: logsumexp's error against the number of folded blocks;
# then tests/test_logsumexp_pass.py, LSE_CAP 150 s).
# Also: testslice (tests TS_FROM to TS_TO, 1-based, of tests1's collection order, TS_CAP seconds; a test stuck
# past TS_STUCK seconds gets every thread's stack dumped: on 2026-12-07 tests1 reached test 452 of 1060 in 530 s).
# Also: matmul (tpu_tests/matmul_probe.py 8192: the TPU matmul inner blocks against jnp) and hwslice (tests HW_FROM
# to HW_TO, 1-based, of `pytest tpu_tests --co` order, HW_CAP seconds: on 2026-12-06 tests 1-265 of that order ran
# after the scalar-prefetch change, so HW_FROM=266 HW_TO=325 runs the 60 OPS-table rows left). To run your own commands after `env`, append to PYTHONPATH
# (it already holds the machine's jax): export PYTHONPATH=$PYTHONPATH:/tmp/site:$PWD.
# Wheels (cp311, manylinux x86_64) into .whl-tpu: zarr numcodecs donfig google-crc32c pyyaml optax lazy-importer
# absl-py dask partd locket toolz click cloudpickle fsspec importlib_metadata zipp.
# One program at a time may hold the chip, so every step runs in one process, one after another.
# pytest steps get SIGINT at their cap (then KILL 20 s later), so a capped run still prints the failures so far.
set -u
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
ROOT="$(pwd)"
STEPS=",${1:-env,hw,kernels,demo,bench,tests},"
want(){ [[ "$STEPS" == *",$1,"* ]]; }
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site "$ROOT"/.whl-tpu/*.whl > "$OUT/env.log" 2>&1 || { cat "$OUT/env.log"; exit 1; }
export PYTHONPATH=${PYTHONPATH:-}:/tmp/site:$ROOT
SCR=$HOME/jaskscr; mkdir -p $SCR; export JASK_SCRATCH_DIR=$SCR/scratch
T0=$(date +%s); el(){ echo "== $1 at +$(( $(date +%s) - T0 ))s" | tee -a "$OUT/env.log"; }
# tests1's selection within tests/ (testslice numbers the same tests)
SUITE=(-m "not slow" --ignore=tests/test_kernels.py --ignore=tests/test_ops.py --ignore=tests/test_properties.py)
# run_slice NAME FROM TO CAP "RUN FLAGS" SELECTION...: tests FROM to TO (1-based) of SELECTION's collection order
run_slice(){ local name=$1 from=$2 to=$3 cap=$4 flags=$5; shift 5
  python3 -m pytest "$@" --co -q -o addopts="" -p no:cacheprovider 2>/dev/null | grep "::" | sed -n "${from},${to}p" > /tmp/$name.txt
  timeout -s INT -k 20 $cap python3 -m pytest @/tmp/$name.txt -q -o addopts="" -p no:cacheprovider -rfE $flags > "$OUT/$name.log" 2>&1
  echo "rc=$? ($(wc -l < /tmp/$name.txt) tests selected)" >> "$OUT/$name.log"; }
if want env; then
  { el env; nproc; free -g | head -2; df -h $HOME /tmp | cat; python3 -c 'import platform; print(platform.libc_ver())'
    python3 -c "import jax,jaxlib,zarr,optax; print('jax',jax.__version__,'jaxlib',jaxlib.__version__,'zarr',zarr.__version__,'optax',optax.__version__, jax.devices())"
    python3 -c "import jask; from jask import kernels; print('jask backend', kernels.backend_name())"
    python3 -c "import resource, jax; r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; jax.devices(); jax.numpy.zeros(1).block_until_ready(); print('peak RSS MiB: after import', r0 // 1024, 'after opening the device', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)"; } >> "$OUT/env.log" 2>&1
fi
if want hw; then
  el hw; timeout -s INT -k 20 240 python3 -m pytest tpu_tests -q -o addopts="" -p no:cacheprovider --maxfail=20 -rfE > "$OUT/hw.log" 2>&1; echo "rc=$?" >> "$OUT/hw.log"
fi
if want kernels; then
  el kernels
  { for b in xla pallas; do for d in float32 bfloat16; do
      echo "### backend=$b dtype=$d"
      timeout 60 python3 -m jask.bench.kernels --op=dot,add --dtype=$d --n=8192 --block=1024 --backend=$b --repeat=5 2>&1 | grep -vE "^(I|W)[0-9]{4}" | tail -8
    done; done
    echo "### backend=xla path=tiles"
    timeout 50 python3 -m jask.bench.kernels --op=dot,add --n=8192 --block=1024 --backend=xla --path=tiles --repeat=5 2>&1 | tail -4
  } > "$OUT/kernels.log" 2>&1
fi
if want demo; then
  el demo; { for b in auto xla; do echo "### backend=$b"; JASK_BACKEND=$b timeout 70 python3 -m jask.demo --data_dir=$SCR/demo; echo "rc=$?"; done
    echo "### 4 GiB, backend=auto, budget 1GB"
    timeout 120 python3 -m jask.demo --data_dir=$SCR/demo4 --rows=8388608 --features=128 --budget=1GB --steps=3; echo "rc=$?"; } > "$OUT/demo.log" 2>&1
fi
if want bench; then
  el bench; timeout ${BENCH_CAP:-180} python3 -m jask.bench --workload=sum --gib=2 --budget=2GB --repeat=3 --peers=jnp,raw-io --cache=warm --read_mmap=off,auto,on --data_dir=$SCR/bd --out=$SCR/bout > "$OUT/bench.log" 2>&1; echo "rc=$?" >> "$OUT/bench.log"
  cp $SCR/bout/results.md "$OUT/bench_results.md" 2>/dev/null
fi
if want grad; then
  el grad; timeout ${GRAD_CAP:-240} python3 -m jask.bench --workload=grad --gib=1 --budget=2GB --repeat=2 --peers=raw-io --cache=warm --data_dir=$SCR/gd --out=$SCR/gout > "$OUT/grad.log" 2>&1; echo "rc=$?" >> "$OUT/grad.log"
  cp $SCR/gout/results.md "$OUT/grad_results.md" 2>/dev/null
fi
if want probe; then
  el probe; timeout 240 python3 tpu_tests/transfer_probe.py --gib=2 --scratch=$SCR/probe > "$OUT/probe.log" 2>&1; echo "rc=$?" >> "$OUT/probe.log"
fi
if want matmul; then
  el matmul; timeout ${MATMUL_CAP:-240} python3 tpu_tests/matmul_probe.py 8192 2>&1 | grep -vE "^(I|W)[0-9]{4}" > "$OUT/matmul.log"
  echo "rc=$?" >> "$OUT/matmul.log"
fi
if want hwslice; then
  el hwslice; run_slice hwslice ${HW_FROM:-1} ${HW_TO:-100000} ${HW_CAP:-300} "" tpu_tests
fi
if want scale; then
  el scale; JAX_PLATFORMS=cpu timeout ${SCALE_CAP:-240} python3 -m jask.bench --workload=sum --gib=0.5,2 --cache=warm --peers=raw-io \
    --repeat=5 --rounds=2 --processes=1,2,4 --budget=64MB --data_dir=$SCR/sd --out=$SCR/sout > "$OUT/scale.log" 2>&1
  echo "rc=$?" >> "$OUT/scale.log"; cp $SCR/sout/results.md "$OUT/scale_results.md" 2>/dev/null
fi
if want split; then
  el split; JAX_PLATFORMS=cpu timeout ${SPLIT_CAP:-180} python3 tpu_tests/split_probe.py $SCR/split 2 5 > "$OUT/split.log" 2>&1
  echo "rc=$?" >> "$OUT/split.log"
fi
if want compile; then
  el compile; { for b in auto xla; do echo "### backend=$b"; JASK_BACKEND=$b timeout ${COMPILE_CAP:-150} python3 tpu_tests/compile_probe.py $SCR/cd 1 2>&1 \
    | grep -vE "^(I|W)[0-9]{4}|^WARNING:jax|warnings.warn|hugepages"; echo "rc=$?"; done; } > "$OUT/compile.log" 2>&1
fi
if want bands; then
  el bands; JASK_MEMORY_BUDGET=2GB timeout ${BANDS_CAP:-240} python3 -m jask.bench.kernels --op=dot --n=8192 --block=1024 --path=jask \
    --backend=auto --bands=on,off --repeat=3 2>&1 | grep -E "ratio|^jax " > "$OUT/bands.log"; echo "rc=${PIPESTATUS[0]}" >> "$OUT/bands.log"
fi
if want stack; then
  el stack; timeout ${STACK_CAP:-200} python3 tpu_tests/stack_probe.py $SCR/cd 1 3 2>&1 \
    | grep -vE "^(I|W)[0-9]{4}|^WARNING:jax|warnings.warn|hugepages" > "$OUT/stack.log"; echo "rc=${PIPESTATUS[0]}" >> "$OUT/stack.log"
fi
if want lse; then
  el lse; { timeout ${LSE_CAP:-150} python3 tpu_tests/lse_probe.py 2>&1 | grep -vE "^(I|W)[0-9]{4}|^WARNING:jax|warnings.warn|hugepages"
    timeout 100 python3 tpu_tests/fold_probe.py 2>&1 | grep -vE "^(I|W)[0-9]{4}|^WARNING:jax|warnings.warn|hugepages"
    timeout -s INT -k 10 150 python3 -m pytest tests/test_logsumexp_pass.py -q -o addopts="" -p no:cacheprovider -rfE --tb=short; echo "rc=$?"; } \
    > "$OUT/lse.log" 2>&1
fi
if want tests1; then
  el tests1; timeout -s INT -k 20 ${TESTS1_CAP:-420} python3 -m pytest ${TESTS1_FILES:-tests} "${SUITE[@]}" -q -o addopts="" -p no:cacheprovider \
    -rfE --durations=15 > "$OUT/tests1.log" 2>&1
  echo "rc=$?" >> "$OUT/tests1.log"
fi
if want testslice; then
  el testslice; run_slice testslice ${TS_FROM:-1} ${TS_TO:-100000} ${TS_CAP:-400} \
    "--durations=10 -o faulthandler_timeout=${TS_STUCK:-300}" tests "${SUITE[@]}"
fi
if want tests2; then
  el tests2; timeout -s INT -k 20 ${TESTS2_CAP:-400} python3 -m pytest ${TESTS2_FILES:-tests/test_ops.py tests/test_kernels.py} -q -o addopts="" -p no:cacheprovider \
    -rfE --durations=15 -m "not slow" > "$OUT/tests2.log" 2>&1; echo "rc=$?" >> "$OUT/tests2.log"
fi
if want tests; then
  el tests; timeout -s INT -k 20 300 python3 -m pytest tests -q -o addopts="" -p no:cacheprovider --maxfail=40 -rfE -m "not slow" > "$OUT/tests.log" 2>&1; echo "rc=$?" >> "$OUT/tests.log"
fi
el done
