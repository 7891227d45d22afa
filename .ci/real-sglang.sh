#!/usr/bin/env bash
# CI stage (called by .ci/run after the README's test command): real SGLang on CPU.
#  1. the release's environment (python -m gpu.sglang_cpu install; a no-op when it is up to date);
#  2. the conformance cases on real SGLang, on one pair of engines in Ray actors on a simulated 2-node cluster (the
#     -m gpu path's backend), shared by the session and reset between scenarios (-m sglang --conformance-sglang-ray
#     conformance/suite), and on the same engines every mutant (tests/gpu/test_mutants_real.py: killed by the same
#     checks as on the fake);
#  3. the one-engine checks: the reset and teardown of shared engines (tests/gpu/test_engine_pool.py);
#  4. the differential fidelity check, fake against real SGLang (tests/gpu/test_fidelity.py), on one release real
#     SGLang runs on CPU (fakes.facts.SGLANG.cpu_releases, this one included), in its own environment, chosen by
#     commit count: every release runs at least once in as many commits as there are (the releases are pinned, so
#     only the fake changes between commits, and each list's script and fake digests are checked on every run by
#     the README's test command: a fake that changed fails there until its lists are re-measured).
# At most two real engines run at once (2 in step 2, 1 in steps 3 and 4); the local-process engines (gpu.local) serve
# step 3's pool checks. pytest exit 5 (nothing collected) fails, and
# so does a step where every test skipped (.ci/ran_something.py).
set -euo pipefail
cd "$(dirname "$0")/.."
release=${WEIGHTSYNC_CI_SGLANG_RELEASE:-0.5.23}
started=$SECONDS

python -m gpu.sglang_cpu install --release "$release"
echo "CI: real SGLang $release environment ready in $((SECONDS - started)) s"

source .ci/stage.sh
run() {  # run RELEASE PYTEST-ARGS...
  local release=$1
  shift
  run_stage "real SGLang $release" -m sglang --conformance-sglang-release "$release" "$@"
}

cases=0; checks=0; others=0
run "$release" --conformance-sglang-ray conformance/suite tests/gpu/test_mutants_real.py || cases=$?
run "$release" tests/gpu/test_engine_pool.py || checks=$?
all=($(python -c "from fakes.facts import SGLANG; print(*SGLANG.cpu_releases)"))
commits=$(git rev-list --count HEAD 2>/dev/null || echo 0)
chosen=${all[$(( commits % ${#all[@]} ))]}
echo "CI: real SGLang differential this commit: $chosen (of ${all[*]}, by commit count)"
t0=$SECONDS
if python -m gpu.sglang_cpu install --release "$chosen"; then
  echo "CI: real SGLang $chosen environment ready in $((SECONDS - t0)) s"
  run "$chosen" tests/gpu/test_fidelity.py || others=$?
else
  others=1
fi
echo "CI: real SGLang stage (install + tests) took $((SECONDS - started)) s"
[ "$cases" -ne 0 ] && exit "$cases"
[ "$checks" -ne 0 ] && exit "$checks"
exit "$others"
