#!/usr/bin/env bash
# `make demo`: the selection-engine story, end to end, on the bundled Nemotron-3-Nano config.
#
# A team serves NVIDIA Nemotron-3-Nano-30B-A3B (BF16, non-gated relu2 experts) with LoRA and
# sets MOE_POLICY_BACKEND=flashinfer_cutlass. FlashInfer CUTLASS cannot apply LoRA: the policy
# must run Triton and say so (warn mode), or refuse (strict mode). Every step is a dry run for
# an H200, so it runs the same on a laptop. The script checks each exit code it expects.
set -uo pipefail
cd "$(dirname "$0")/.."

# `make demo` installs the base package (no torch) into .venv-demo; MOE_POLICY_CLI and
# PYTHON point it at another installation.
MOE=${MOE_POLICY_CLI:-.venv-demo/bin/moe-policy}
PY=${PYTHON:-.venv-demo/bin/python}
for tool in "$MOE" "$PY"; do
    command -v "$tool" > /dev/null || { echo "demo: $tool not found; run \`make demo\`" >&2; exit 2; }
done
MODEL=configs/models/nemotron-3-nano-30b-a3b.json
H200=(--platform cuda --capability 9.0 --device-name "NVIDIA H200")
H200_SHOWN='--platform cuda --capability 9.0 --device-name "NVIDIA H200"'
AUDIT=$(mktemp -t moe-policy-demo-XXXXXX.jsonl)
trap 'rm -f "$AUDIT"' EXIT

# Start from a clean policy environment: only what each step sets.
for name in $(env | grep -oE '^(MOE_POLICY_|VLLM_)[A-Za-z0-9_]*' || true); do unset "$name"; done

bold=$'\033[1m'; dim=$'\033[2m'; off=$'\033[0m'
[ -t 1 ] || { bold=""; dim=""; off=""; }

step() { printf '\n%s==== %s ====%s\n' "$bold" "$*" "$off"; }
show() { printf '%s$ %s%s\n' "$dim" "$*" "$off"; }

# expect CODE CMD...: run CMD, fail the demo unless it exits with CODE.
expect() {
    local want=$1; shift
    "$@"
    local got=$?
    if [ "$got" -ne "$want" ]; then
        printf 'demo FAILED: expected exit %s, got %s from: %s\n' "$want" "$got" "$*" >&2
        exit 1
    fi
    printf '%s-> exit %s, as expected%s\n' "$bold" "$got" "$off"
}

# summary: the decision record on stdin, in one line per fact.
summary() {
    "$PY" -c '
import json, sys
d = json.load(sys.stdin)
print("backend: %s (%s, %s format)" % (d["backend"], d["experts_class"], d["activation_format"]))
req = d["requested"]
print("outcome: %s%s" % (d["outcome"], " -- requested %s via %s" % (req["backend"], req["origin"]) if req else ""))
for o in d["overrides"]:
    print("override: %s -> %s: %s (%s)" % (o["requested"], o["selected"], o["reason_code"], o["origin"]))
for a in d["adaptations"]:
    print("adapted: %s -> %s" % (a["requested"], a["adapted_to"]))
'
}

step "1. H200 dry run, LoRA on, MOE_POLICY_BACKEND=flashinfer_cutlass (warn mode)"
echo "Expected: the request is overridden (lora_unsupported), Triton runs, a warning event names"
echo "env:MOE_POLICY_BACKEND, and the report says what strict mode would do."
show MOE_POLICY_BACKEND=flashinfer_cutlass moe-policy explain --model $MODEL $H200_SHOWN --lora
expect 0 env MOE_POLICY_BACKEND=flashinfer_cutlass \
    "$MOE" explain --model "$MODEL" "${H200[@]}" --lora --audit-log "$AUDIT" --log-format console

step "2. The same in strict mode: refused, nothing starts"
show MOE_POLICY_BACKEND=flashinfer_cutlass moe-policy explain --model $MODEL $H200_SHOWN --lora --mode strict --json
run_strict() {
    env MOE_POLICY_BACKEND=flashinfer_cutlass "$MOE" explain --model "$MODEL" "${H200[@]}" --lora \
        --mode strict --json --audit-log "$AUDIT" --log-format console | summary
    return "${PIPESTATUS[0]}"
}
expect 3 run_strict

step "3. A plain run without LoRA: the request is honoured, no warning"
show MOE_POLICY_BACKEND=flashinfer_cutlass moe-policy explain --model $MODEL $H200_SHOWN --json
run_plain() {
    env MOE_POLICY_BACKEND=flashinfer_cutlass "$MOE" explain --model "$MODEL" "${H200[@]}" --json \
        --log-format console | summary
    return "${PIPESTATUS[0]}"
}
expect 0 run_plain

step "4. LoRA with expert parallelism over DeepEP low-latency: the batched format holds"
echo "Expected: batched_triton (LoRA per expert row), never plain triton."
show moe-policy explain --model $MODEL $H200_SHOWN --lora --ep --tp 2 --all2all deepep_low_latency --json
run_batched() {
    "$MOE" explain --model "$MODEL" "${H200[@]}" --lora --ep --tp 2 --all2all deepep_low_latency \
        --json --log-format console | summary
    return "${PIPESTATUS[0]}"
}
expect 0 run_batched

step "5. The same deployment in vLLM 0.33 (dry run of its engine profile; no vLLM needed)"
echo "Expected: vLLM's LoRA layer accepts expert parallelism only with allgather_reducescatter;"
echo "moe_policy refuses at selection, naming the key and where it came from (exit 2)."
show moe-policy explain --engine vllm --model $MODEL $H200_SHOWN --lora --ep --dp 2 --all2all deepep_low_latency
expect 2 "$MOE" explain --engine vllm --model "$MODEL" "${H200[@]}" --lora --ep --dp 2 \
    --all2all deepep_low_latency --log-format console

step "Audit log"
printf '%s decision lines in %s (steps 1 and 2), e.g. the first one:\n' "$(wc -l < "$AUDIT")" "$AUDIT"
head -n 1 "$AUDIT" | "$PY" -c '
import json, sys
r = json.loads(sys.stdin.readline())
print({k: r[k] for k in ("timestamp", "host", "pid", "backend", "outcome", "mode", "count")})'

printf '\n%sDemo complete: every step exited as expected.%s\n' "$bold" "$off"
