#!/usr/bin/env bash
# The CUDA-only tests, for a machine with a GPU (CI has none): every registered method on CUDA against the CPU
# (tests/test_cuda.py), load_images onto the GPU, SmoothGrad's generator on the inputs' device, the checks after the
# work read without a wait (tests/test_late_checks.py), and Lightning's fp16 GradScaler when lightning is installed.
#
# Run from anywhere, with OUT set to a folder for the log:  OUT=/tmp/out bash tools/gpu_check.sh
# It needs python3 with torch, torchvision and pytest, and hookviz's runtime dependencies (numpy, matplotlib, pillow,
# safetensors, tqdm); not hookviz itself (PYTHONPATH=. : it has no compiled parts) nor the dev extra's reference
# libraries (captum, zennit, lxt, quantus: the tests run here do not use them) nor nbmake (pyproject's addopts ask for
# --nbmake -n 2, hence -o addopts=""). The log is "$OUT/gpu_check.log"; the exit status is pytest's.
set -u -o pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the log goes to}"
mkdir -p "$OUT"
log="$OUT/gpu_check.log"
py=${PYTHON:-python3}

tests=(
    tests/test_cuda.py
    tests/test_inputs.py::test_cuda_device
    tests/test_gradient_family.py::test_smoothgrad_generator_on_the_inputs_device
    tests/test_late_checks.py::test_on_cuda_the_values_come_without_a_wait_and_the_warning_once
)
if "$py" -c "import lightning.pytorch, tensorboard" 2>/dev/null; then
    tests+=(tests/test_integrations_lightning.py::test_fp16_with_the_precision_plugins_scaler_reads_unscaled_gradients)
else
    lightning="lightning (or tensorboard) is not importable: its fp16 CUDA test is left out"
fi

{
    echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')"
    PYTHONPATH=. "$py" -c '
import importlib.util, torch
print("torch", torch.__version__, "| CUDA available:", torch.cuda.is_available(),
      "|", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")
missing = [m for m in ("torchvision", "numpy", "matplotlib", "PIL", "safetensors", "tqdm", "pytest")
           if importlib.util.find_spec(m) is None]
print("missing runtime dependencies:", ", ".join(missing) if missing else "none")'
    [ -n "${lightning:-}" ] && echo "$lightning"
    PYTHONPATH=. "$py" -m pytest -p no:cacheprovider -o addopts="" -q -rfEs -s "${tests[@]}"
} 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

{
    echo
    echo "== summary (log: $log)"
    grep -E "^(FAILED|ERROR|SKIPPED) " "$log" | cut -c1-200
    echo "largest differences, CUDA against the CPU (relative to the CPU map's largest value):"
    grep -oE "[A-Za-z0-9_]+ [A-Za-z0-9+_-]+: max\|cuda - cpu\| / max\|cpu\| = [0-9.e+-]+ \(tolerance [^)]*\)" "$log" |
        sort -u | sort -t= -k2 -g -r | head -8 | sed 's/^/  /'
    grep -E "^[0-9]+ (passed|failed)|(passed|failed|skipped|error).* in [0-9.]+s" "$log" | tail -1
    echo "exit status: $status"
} | tee -a "$log"
exit "$status"
