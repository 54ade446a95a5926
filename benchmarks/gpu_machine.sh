#!/usr/bin/env bash
# The GPU checks, on a machine with CUDA, its own torch, no DGL and no network (the lent H100):
#   bash benchmarks/gpu_machine.sh            run from the repository root; results go to $OUT
# It needs, in ignored folders that travel with the working tree:
#   .whl/        DGL 2.1.0's wheel for that machine's Python, e.g. for Python 3.12:
#                pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#                  --platform manylinux1_x86_64 -d .whl dgl==2.1.0
#                and torch-geometric's (pure Python; the PyG-batch test runs where it is there):
#                pip download --no-deps -d .whl torch-geometric
#   .gpu_data/   a copy of ../shared/datasets (the README's main job reads Tolokers from it)
# DGL is installed beside the machine's torch without its dependencies (that machine has them);
# graphtrainer's compatibility layer lets DGL 2.1.0 load on that torch. Most important first:
# the device-sampling benchmark, the README's main job on one GPU, then every GPU test.
set -u -o pipefail
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/gt-site .whl/dgl-2.1.0-*.whl \
  $(ls .whl/torch_geometric-*.whl 2>/dev/null)
export PYTHONPATH=/tmp/gt-site:$PWD DGLBACKEND=pytorch PYTHONUNBUFFERED=1 GRAPHTRAINER_DATA=$PWD/.gpu_data
status=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc
  python3 -c "import sys, torch, graphtrainer, dgl
from graphtrainer._compat.dgl_2_1 import graphbolt_available
print('python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA', torch.version.cuda, '| dgl', dgl.__version__,
      '| DGL GraphBolt:', 'loaded' if graphbolt_available() else 'placeholder (no library for this torch)')"
} 2>&1 | tee "$OUT/env.txt" || status=1
# Sampling on the GPU against DGL's CPU sampling and 2 CPU ranks (50k and products-sized graphs),
# with the torch ops per batch and a profile of 3 batches (kernels against the host launching them).
timeout 225 python3 benchmarks/device_sampling.py --gpu --steps 30 --out "$OUT/device_sampling" 2>&1 \
  | grep -v Warning | tee "$OUT/device_sampling.log" | tail -40 || status=1
# The README's main job, on the GPU ("auto" samples there).
timeout 80 python3 -m graphtrainer.examples.node_classification --dataset tolokers --gpus 1 --root-dir /tmp/gt-runs \
  2>&1 | grep -v Warning | tail -8 | tee "$OUT/main_job.log" || status=1
# Every GPU test, none skipped for lack of CUDA or DGL (6 workers: the tests are separate processes),
# and PyG batches on the GPU (skipped, saying so, without torch-geometric).
timeout 255 python3 -m pytest -v -rs -p no:cacheprovider -n 6 tests/integration/test_gpu.py \
  tests/integration/test_pyg_gpu.py::test_pyg_batches_on_a_gpu 2>&1 \
  | tee "$OUT/test_gpu.log" | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" || status=1
exit $status
