#!/usr/bin/env bash
# Real-GPU check of the NVML backend (issue #5 item 8): inventory, MIG mode per GPU,
# telemetry/health, and one job through LocalExecutor pinned to the first GPU (or MIG
# device) by UUID. Read-only (never changes MIG). Under five minutes; exits 0 with one
# "gpu_check: skipped: ..." line on a machine without an NVIDIA GPU or driver.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python}"

skip() {
    echo "gpu_check: skipped: no NVIDIA GPU/driver ($1)"
    exit 0
}

command -v nvidia-smi >/dev/null 2>&1 || skip "nvidia-smi not found"
if ! reason="$("$PY" - <<'PYEOF' 2>&1
try:
    import pynvml
except ImportError:
    raise SystemExit("nvidia-ml-py is not installed: pip install nvidia-ml-py")
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as exc:
    raise SystemExit(f"NVML init failed: {exc}")
if pynvml.nvmlDeviceGetCount() == 0:
    raise SystemExit("NVML reports 0 GPUs")
pynvml.nvmlShutdown()
PYEOF
)"; then
    skip "$(printf '%s' "$reason" | tail -n 1)"
fi

step() { echo; echo "== gpu_check: $* =="; }

step "nvidia-smi"
timeout 60 nvidia-smi -L
timeout 60 nvidia-smi --query-gpu=index,uuid,name,mig.mode.current,mig.mode.pending,driver_version \
    --format=csv || echo "(MIG query not supported by this nvidia-smi)"

step "rlsched inventory show --backend nvml"
timeout 60 rlsched inventory show --backend nvml
timeout 60 rlsched inventory show --backend nvml --json >/dev/null

step "telemetry and health events"
timeout 60 "$PY" - <<'PYEOF'
import json
from rlsched.runtime.nvml_backend import NvmlBackend

with NvmlBackend() as be:
    print(json.dumps(be.telemetry(), indent=1))
    print("health events:", be.health_events(timeout_ms=200))
PYEOF

step "pytest -m gpu (inventory, MIG mode per GPU, telemetry, LocalExecutor job with torch)"
timeout 240 "$PY" -m pytest -m gpu tests/gpu tests/runtime/test_nvml_backend.py -q -rs -s -p no:cacheprovider

echo
echo "gpu_check: ok"
