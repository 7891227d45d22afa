#!/usr/bin/env bash
# CI stage (called by .ci/run after the README's test command): real SGLang on CPU.
#  1. the release's environment (python -m gpu.sglang_cpu install; a no-op when it is up to date);
#  2. the conformance cases on real SGLang, on one pair of engines shared by the session and reset between scenarios
#     (-m sglang conformance/suite; the mutants on real SGLang, tests/gpu/test_mutants_real.py, are run by hand: on
#     2 busy cores they would take CI past its 30 minutes);
#  3. the one-engine checks: the reset and teardown of shared engines (tests/gpu/test_engine_pool.py) and the
#     differential fidelity check, fake against real SGLang (tests/gpu/test_fidelity.py).
# At most two real engines run at once (2 in step 2, 1 in step 3). pytest exit 5 (nothing collected) fails, and so
# does a step where every test skipped (.ci/ran_something.py).
set -euo pipefail
cd "$(dirname "$0")/.."
release=${WEIGHTSYNC_CI_SGLANG_RELEASE:-0.5.23}
started=$SECONDS

python -m gpu.sglang_cpu install --release "$release"
echo "CI: real SGLang $release environment ready in $((SECONDS - started)) s"

junit=$(mktemp -d)
run() {
  local t0=$SECONDS code xml="$junit/stage-$SECONDS-$RANDOM.xml"
  set +e
  pytest -m sglang -p no:cacheprovider --timeout 900 --conformance-sglang-release "$release" --junitxml "$xml" "$@"
  code=$?
  set -e
  echo "CI: pytest -m sglang $* -> exit $code in $((SECONDS - t0)) s"
  if [ "$code" -eq 5 ]; then
    echo "CI: pytest collected no tests (exit 5) — failing" >&2
    code=1
  elif [ "$code" -eq 0 ] && ! python .ci/ran_something.py "$xml"; then
    code=1  # every test skipped: the real engine never judged anything
  fi
  return "$code"
}

cases=0; checks=0
run conformance/suite || cases=$?
run tests/gpu/test_engine_pool.py tests/gpu/test_fidelity.py || checks=$?
echo "CI: real SGLang stage (install + tests) took $((SECONDS - started)) s"
[ "$cases" -ne 0 ] && exit "$cases"
exit "$checks"
