#!/usr/bin/env bash
# CI stage: the suite installed the way an adopter installs it. Builds the sdist and the wheel, installs the wheel
# (not editable) into a fresh virtual environment outside the source tree, checks what it ships (package data, the
# pytest11 entry point, python -m conformance, python -m fakes), then runs the scratch adopter project
# (examples/adopter_project: its own --model-path, its own tests, the suite as a test class, known failures listed)
# against it under -n 2 --dist load. Exit 0 only when every step passed; prints its wall time.
set -euo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/weightsync-adopter.XXXXXX")"
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
t0=$(date +%s)
step() { echo "adopter: $*"; }

step "build the sdist and the wheel from the tracked files (PEP 517 hooks, nothing downloaded)"
mkdir -p "$WORK/src"
(cd "$SRC" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar cf - 2>/dev/null) \
  | tar xf - -C "$WORK/src"
for hook in build_sdist build_wheel; do  # one process each (setuptools keeps state between the two)
  (cd "$WORK/src" && "$PY" -c "import sys; from setuptools import build_meta; print('  built', build_meta.$hook(sys.argv[1]))" \
    "$WORK/dist") >>"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
done
grep "^  built" "$WORK/build.log"
sdist=$(ls "$WORK"/dist/*.tar.gz) wheel=$(ls "$WORK"/dist/*.whl)
tar tzf "$sdist" >"$WORK/sdist.txt"
for member in fakes/snapshots/io_struct-0.5.23.json reports/schema.json conformance/suite/__init__.py \
              weightsync_conformance/plugin.py; do
  grep -q "/$member\$" "$WORK/sdist.txt" || { echo "adopter: the sdist lacks $member" >&2; exit 1; }
  "$PY" -c "import sys, zipfile; sys.exit('$member' not in zipfile.ZipFile('$wheel').namelist())" \
    || { echo "adopter: the wheel lacks $member" >&2; exit 1; }
done

step "install the wheel into a fresh venv outside the tree (dependencies from this machine's site-packages)"
"$PY" -m venv --system-site-packages "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install --quiet --disable-pip-version-check --no-deps --no-index --force-reinstall "$wheel"

cd "$WORK"
step "what the installed package ships"
"$VPY" - <<'PYEOF'
import importlib.metadata as md, importlib.resources as res, json, sys
import conformance, fakes, reports, weightsync_conformance.plugin as plugin
for module in (conformance, fakes, reports, plugin):
    assert module.__file__.startswith(sys.prefix), f"{module.__name__} imported from {module.__file__}, not the venv"
dist = md.distribution("weightsync-conformance")
assert '"editable": true' not in (dist.read_text("direct_url.json") or ""), "the venv holds an editable install"
assert [ep.value for ep in dist.entry_points if ep.group == "pytest11"] == ["weightsync_conformance.plugin"]
assert sorted(p.name for p in res.files("fakes").joinpath("snapshots").iterdir() if p.name.endswith(".json"))
json.loads(res.files("reports").joinpath("schema.json").read_text())
print(f"  {dist.name} {dist.version} from {plugin.__file__.rsplit('/weightsync_conformance', 1)[0]}")
PYEOF
cases=$("$VPY" -m conformance --list-cases | wc -l)
[ "$cases" -gt 0 ] || { echo "adopter: python -m conformance --list-cases listed nothing" >&2; exit 1; }
"$VPY" -m fakes --help >/dev/null
echo "  python -m conformance --list-cases: $cases cases; python -m fakes --help: ok"

step "the scratch adopter project, -n 2 --dist load, against the installed wheel"
cp -r "$SRC/examples/adopter_project" "$WORK/project"
cd "$WORK/project"
t1=$(date +%s)
set +e
"$VPY" -m pytest -n 2 --dist load --model-path /models/llama -p no:cacheprovider \
  --conformance-report results/conformance-result.json >"$WORK/project.log" 2>&1
code=$?
set -e
tail -3 "$WORK/project.log"
if [ "$code" -ne 0 ] || ! grep -q "xfailed" "$WORK/project.log" \
   || ! grep -q "## Expected failures" results/conformance-result.md; then
  cat "$WORK/project.log"
  echo "adopter: the scratch project failed (pytest exit $code) or showed no expected failure" >&2
  exit 1
fi
"$VPY" -m reports diff results/conformance-result.json results/conformance-result.json >/dev/null
t2=$(date +%s)
echo "adopter: ok — project run $((t2 - t1)) s, stage $((t2 - t0)) s in all"
