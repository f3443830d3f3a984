#!/usr/bin/env bash
# Gathers here, in the repository root, what benchmarks/device_vulkan.sh unpacks on a bare GPU machine that
# reaches no network: .gl/ (the Vulkan loader's .deb, for x86-64), .whl/ (vulkan, cffi, pycparser and gguf wheels
# for the machine's Python, 3.12 by default) and .devshared/ (the shared tiny models the Vulkan tests compare with
# llama.cpp, and the two vocabularies make_shape_model.py needs). All three are ignored by git (.git/info/exclude)
# and travel as carried paths, with ggflow.egg-info (the entry points of an editable install), ~32 MiB in all:
#
#   bash benchmarks/device_vulkan_prepare.sh [PYTHON_VERSION]
#   device run: PARTS="kernels tests step bench" bash benchmarks/device_vulkan.sh $OUT
#               carry: .gl .whl .devshared ggflow.egg-info
set -eu
cd "$(dirname "$0")/.."
PY=${1:-3.12}
SHARED=../shared
for path in /.gl/ /.whl/ /.devshared/; do
    grep -qx "$path" .git/info/exclude 2>/dev/null || echo "$path" >> .git/info/exclude
done
[ -f ggflow.egg-info/entry_points.txt ] || { echo "ggflow.egg-info is missing: pip install -e . first" >&2; exit 2; }

mkdir -p .gl /tmp/amd64/partial
apt_opts="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64"
apt-get $apt_opts update -qq
(cd .gl && apt-get $apt_opts download libvulkan1)

mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl cffi pycparser vulkan gguf

mkdir -p .devshared/models .devshared/vocab
for name in tiny-llama-hs-f32 tiny-llama-hs-q4_0 tiny-llama-hs-q4_k_m tiny-qwen2-hs-q8_0 tiny-gpt2-hs-f32; do
    cp "$SHARED/models/$name.gguf" "$SHARED/models/$name.llamacpp.json" \
       "$SHARED/models/$name.llamacpp.gen_logits.npy" .devshared/models/
done
cp "$SHARED/vocab/ggml-vocab-starcoder.gguf" "$SHARED/vocab/ggml-vocab-llama-spm.gguf" .devshared/vocab/
du -sh .gl .whl .devshared ggflow.egg-info
