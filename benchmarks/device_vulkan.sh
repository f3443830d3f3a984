#!/usr/bin/env bash
# The Vulkan backend on a GPU machine in one bounded run (issue 14, item 6): the device, the Vulkan tests,
# bench_vulkan.py and `ggflow bench --backend vulkan` beside `--backend cpu`, on random-weight models of real
# shapes made there (the default model's 98 MB does not travel; make_shape_model.py + `ggflow quantize` do).
#
#   bash benchmarks/device_vulkan.sh OUTDIR        # every step has its own timeout; the whole run < 7 min
#   PARTS="tests step" bash benchmarks/device_vulkan.sh OUTDIR    # some of: kernels tests step bench cpu profile
#
# Runs anywhere with a Vulkan driver (lavapipe too: set MODELS="smollm2-135m:Q4_1" to keep it short). On a
# bare machine it first unpacks what the caller carried: .gl/*.deb (the Vulkan loader, where ldconfig has
# none), .whl/*.whl (vulkan, cffi, pycparser, gguf, where python3 lacks them) and .devshared/ (the shared
# test models and vocabularies, linked as ../shared); benchmarks/device_vulkan_prepare.sh gathers them. Nothing
# here needs the network.
set -u
OUT=${1:-${OUT:-/tmp/device_vulkan}}
MODELS=${MODELS:-"smollm2-135m:Q4_1 tinyllama-1.1b:Q4_0"}
CPU_THREADS=${CPU_THREADS:-8}
PARTS=${PARTS:-"kernels tests step bench cpu profile"}
want() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p "$OUT" /tmp/device_models
export PYTHONUNBUFFERED=1
START=$(date +%s)
step() { echo; echo "== $(( $(date +%s) - START )) s: $*"; }
run() { local limit=$1; shift; timeout "$limit" "$@"; local rc=$?; [ $rc = 0 ] || echo "!! rc=$rc: $*"; return $rc; }

step "setup"
if ! ldconfig -p | grep -q 'libvulkan.so.1' && [ -d .gl ]; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
fi
if ! python3 -c "import vulkan, gguf" 2>/dev/null && [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}   # ggflow.egg-info beside the package: the entry points
[ -e ../shared ] || { [ -d .devshared ] && ln -s "$PWD/.devshared" ../shared; }
ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -f $ICD ] && [ -z "$(ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>/dev/null | grep -i nvidia)" ]; then
    export VK_DRIVER_FILES=$ICD
fi

step "machine"
nvidia-smi -L 2>/dev/null
lscpu | grep -E 'Model name|^CPU\(s\)|Flags' | cut -c1-160
python3 -c "import sys, numpy, numba, llvmlite; print(sys.version.split()[0], 'numpy', numpy.__version__, 'numba', numba.__version__, 'llvmlite', llvmlite.__version__)"
run 60 python3 - <<'EOF' || { echo "no Vulkan device: stopping"; exit 3; }
from ggflow.backends_builtin.vulkan.device import get_device, list_devices
print("devices:", list_devices())
dev = get_device()
print("chosen:", dev.info, "\nlimits:", dev.limits)
props = dev.vk.vkGetPhysicalDeviceMemoryProperties(dev.physical)
print("memory types (flags, heap):", [(hex(props.memoryTypes[i].propertyFlags), props.memoryTypes[i].heapIndex)
                                      for i in range(props.memoryTypeCount)])
print("heaps (MiB, flags):", [(props.memoryHeaps[i].size >> 20, hex(props.memoryHeaps[i].flags))
                              for i in range(props.memoryHeapCount)])
EOF

for spec in $MODELS; do   # CPU work, beside the GPU steps
    shape=${spec%%:*}; qtype=${spec##*:}
    echo "python3 benchmarks/make_shape_model.py $shape /tmp/device_models/$shape-f16.gguf && \
python3 -m ggflow.cli quantize -q /tmp/device_models/$shape-f16.gguf /tmp/device_models/$shape-$qtype.gguf $qtype && \
rm /tmp/device_models/$shape-f16.gguf"
done > /tmp/device_models/make.sh
(timeout 300 bash -e /tmp/device_models/make.sh > "$OUT/models.log" 2>&1; echo "models rc=$?" >> "$OUT/models.log") &
MAKER=$!

if want kernels; then
    step "bench_vulkan.py: 4096 x 4096 weights, matvec and mm64"
    run 60 python3 benchmarks/bench_vulkan.py --repeats 20
    step "bench_vulkan.py: 16384 x 8192 weights, matvec and mm512"
    run 60 python3 benchmarks/bench_vulkan.py --types F16 Q4_0 Q8_0 Q4_K Q6_K --rows 16384 --k 8192 --batch 512 \
        --repeats 10
fi

if want tests; then
    step "the Vulkan tests"
    XDIST=""; python3 -c "import xdist" 2>/dev/null && XDIST="-n 8"
    run 200 python3 -m pytest -q $XDIST -p no:cacheprovider tests/test_vulkan_*.py > "$OUT/tests.log" 2>&1
    tail -30 "$OUT/tests.log"
fi

step "models"
wait $MAKER; cat "$OUT/models.log"
for spec in $MODELS; do
    model=/tmp/device_models/${spec%%:*}-${spec##*:}.gguf
    [ -f "$model" ] || { echo "!! $model was not made"; continue; }
    if want step; then
        step "a Vulkan decode step of $model, taken apart"
        for variant in "" "--staged" "--every-barrier" "--no-fuse" "--staged --every-barrier --no-fuse"; do
            run 60 python3 benchmarks/bench_vulkan_step.py "$model" --steps 64 $variant
            [ "$spec" = "${MODELS%% *}" ] || break   # the first model with each switch, the others as they are
        done
    fi
    want bench || continue
    step "ggflow bench $model: vulkan"
    run 90 python3 -m ggflow.cli bench -m "$model" -p 64 -n 32 -r 3 --backend vulkan
    run 90 python3 -m ggflow.cli bench -m "$model" -p 512 -n 0 -r 3 --backend vulkan
    want cpu || continue
    step "ggflow bench $model: cpu, $CPU_THREADS threads"
    run 120 python3 -m ggflow.cli bench -m "$model" -p 64 -n 32 -r 3 -t "$CPU_THREADS"
done

spec=${MODELS%% *}; model=/tmp/device_models/${spec%%:*}-${spec##*:}.gguf
if [ -f "$model" ] && want profile; then
    step "where a Vulkan decode step's time goes (cProfile, tg64)"
    run 60 python3 -m cProfile -s tottime -m ggflow.cli bench -m "$model" -p 0 -n 64 -r 2 --backend vulkan \
        > "$OUT/profile_decode.txt" 2>&1
    grep -A 30 'Ordered by' "$OUT/profile_decode.txt"
fi
step "done"
