#!/usr/bin/env bash
# CI stage: the suite installed the way an adopter installs it. Builds the sdist, and the wheel from it (PEP 517,
# the build backend fetched from the registry), installs the wheel WITH its declared dependencies from the registry
# into a fresh, isolated venv outside the source tree (no system site-packages: the base install, no extra, so no
# torch), checks what it ships, runs the main job (python -m conformance --out results/) there, then installs what
# the scratch adopter project declares (examples/adopter_project/requirements.txt) and runs it (its own
# --model-path, its own tests, the suite as a test class, known failures listed) under -n 2 --dist load. Each
# report is then checked by $WORK/check_reports.py (kept with KEEP_WORK=1, to run by hand on a result), and a
# reports diff against a deliberately changed result must report the change. Exit 0 only when every step passed;
# prints each step's wall time and the stage's.
set -euo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/weightsync-adopter.XXXXXX")"
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
PIP=(--quiet --disable-pip-version-check)
t0=$(date +%s)
step() { echo "adopter: [+$(( $(date +%s) - t0 )) s] $*"; }
die() { echo "adopter: FAILED: $*" >&2; exit 1; }
# run LOG CMD...: CMD's output into LOG; on failure the log's tail and exit 1
run() { local log=$1 code=0; shift; "$@" >"$log" 2>&1 || code=$?; [ "$code" -eq 0 ] || { tail -60 "$log"; die "$* (exit $code)"; }; }

step "build the sdist and, from it, the wheel (tracked files only)"
mkdir -p "$WORK/src"
(cd "$SRC" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar cf - 2>/dev/null) \
  | tar xf - -C "$WORK/src"
"$PY" -m venv "$WORK/build-venv"
run "$WORK/build-tools.log" "$WORK/build-venv/bin/python" -m pip install "${PIP[@]}" build
run "$WORK/build.log" "$WORK/build-venv/bin/python" -m build --outdir "$WORK/dist" "$WORK/src"
sdist=$(ls "$WORK"/dist/*.tar.gz) wheel=$(ls "$WORK"/dist/*.whl)
echo "  built $(basename "$sdist") $(basename "$wheel")"
tar tzf "$sdist" >"$WORK/sdist.txt"
for member in fakes/snapshots/io_struct-0.5.23.json reports/schema.json conformance/suite/__init__.py \
              weightsync_conformance/plugin.py; do
  grep -q "/$member\$" "$WORK/sdist.txt" || die "the sdist lacks $member"
  "$PY" -c "import sys, zipfile; sys.exit('$member' not in zipfile.ZipFile('$wheel').namelist())" \
    || die "the wheel lacks $member"
done

step "install the wheel with its declared dependencies (registry) into an isolated venv outside the tree"
"$PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
run "$WORK/install.log" "$VPY" -m pip install "${PIP[@]}" "$wheel"
"$VPY" -m pip check >"$WORK/pip-check.log" 2>&1 || { cat "$WORK/pip-check.log"; die "pip check"; }
"$VPY" - <<'PYEOF' || die "the venv is not an isolated base install"
import importlib.util, sys
assert sys.prefix != sys.base_prefix, "not a venv"
assert "include-system-site-packages = false" in open(f"{sys.prefix}/pyvenv.cfg").read(), "venv sees site-packages"
extras = [m for m in ("torch", "safetensors", "numpy", "aiohttp", "respx") if importlib.util.find_spec(m)]
assert not extras, f"the base install has {extras}: a base dependency pulls in an extra's package"
PYEOF
echo "  $("$VPY" -m pip list --format=freeze 2>/dev/null | wc -l) distributions; no torch, no extra"

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
[ "$cases" -gt 0 ] || die "python -m conformance --list-cases listed nothing"
"$VPY" -m fakes --help >/dev/null
echo "  python -m conformance --list-cases: $cases cases; python -m fakes --help: ok"

# The report checker: the files are there, the Markdown header, the JSON summary and pytest (its JUnit XML, its
# closing line) agree case by case, every expected failure is in the Markdown table under its invariant, and the
# run says pass (nothing failed that was not listed).
cat >"$WORK/check_reports.py" <<'PYEOF'
"""check_reports.py RESULTS_DIR JUNIT_XML PYTEST_LOG MIN_XFAIL: exit 1, naming the check, when one fails."""
import collections, json, re, sys, xml.etree.ElementTree as ET
from pathlib import Path

results, junit, log, min_xfail = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
problems = []
def check(ok, what):
    if not ok:
        problems.append(what)

files = {s: results / f"conformance-result.{s}" for s in ("json", "md", "html")}
missing = [str(p) for p in files.values() if not p.is_file() or not p.stat().st_size]
if missing:
    sys.exit(f"check_reports: missing or empty: {missing}")
result, md = json.loads(files["json"].read_text()), files["md"].read_text()
cases, summary = result["cases"], result["summary"]
recount = collections.Counter(c["status"] for c in cases)
check(all(summary[s] == recount.get(s, 0) for s in summary), f"JSON summary {summary} != its cases {dict(recount)}")
header = dict((s, int(n)) for s, n in re.findall(r"(pass|fail|unknown|skipped|error) (\d+)", md.splitlines()[2]))
check(header == summary, f"Markdown header {header} != JSON summary {summary}")

# pytest's own view: the JUnit XML, one testcase per item (the conformance cases are test_case[<case>-<backend>])
outcome = {}
for tc in ET.parse(junit).getroot().iter("testcase"):
    kinds = {child.tag: child.get("type", "") for child in tc}
    kind = ("xfailed" if kinds.get("skipped") == "pytest.xfail" else "skipped") if "skipped" in kinds else \
        "failed" if "failure" in kinds or "error" in kinds else "passed"
    outcome[(tc.get("classname"), tc.get("name").split("@")[0])] = kind
conformance = {name[len("test_case["):-1]: kind for (_, name), kind in outcome.items()
               if name.startswith("test_case[")}
check(len(conformance) == len(cases), f"pytest ran {len(conformance)} conformance cases, the report has {len(cases)}")
for c in cases:
    expected = (c.get("expected") or {}).get("outcome")
    want = {"pass": "passed", "skipped": "skipped"}.get(c["status"], "xfailed" if expected == "xfail" else "failed")
    got = conformance.get(f"{c['case']}-{c['backend']}")
    check(got == want, f"{c['case']} ({c['backend']}): report says {c['status']}, pytest {got} (expected {want})")
closing = log.read_text().strip().splitlines()[-1] if log.read_text().strip() else ""
for m in re.finditer(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?)", closing):
    kind = {"errors": "failed", "error": "failed"}.get(m[2], m[2])
    n = sum(k == kind for k in outcome.values())
    check(int(m[1]) == n, f"pytest's closing line says {m[0]}, its JUnit XML {n}")

# expected failures: each listed in the Markdown table, with its invariant, and at least MIN_XFAIL of them
xfails = [c for c in cases if (c.get("expected") or {}).get("outcome") == "xfail"]
check(len(xfails) >= min_xfail, f"{len(xfails)} expected failure(s) in the report, want at least {min_xfail}")
table = md.split("## Expected failures", 1)[1].split("\n## ", 1)[0] if "## Expected failures" in md else ""
for c in xfails:
    row = f"| {c['case']} | {c['backend']} | {c['expected']['reason']} |"
    check(row in table and c["case"].startswith(c["invariant"] + "-"),
          f"expected failure {c['case']} (invariant {c['invariant']}) is not listed in the Markdown: {row}")
# the run says pass: every case passed, was skipped, or failed as listed
bad = [c["case"] for c in cases if c["status"] not in ("pass", "skipped") and c not in xfails]
check(not bad and summary["pass"] > 0, f"the report does not say pass: {summary}, failing unlisted {bad}")
if problems:
    sys.exit("check_reports: " + "\n  ".join(problems))
print(f"  reports ok: {summary['pass']} pass, {summary['skipped']} skipped, {len(xfails)} expected failure(s); "
      f"JSON, Markdown and pytest agree on {len(cases)} cases")
PYEOF

step "the main job on the base install: python -m conformance --out results/"
mkdir "$WORK/main" && cd "$WORK/main"
t1=$(date +%s)
run "$WORK/main.log" "$VPY" -m conformance --out results/ -- --junitxml=results/junit.xml -p no:cacheprovider
main_s=$(( $(date +%s) - t1 ))
grep -E "^=+ .* in [0-9.]+s" "$WORK/main.log" | tail -1 >"$WORK/main.closing"
cat "$WORK/main.closing"
"$VPY" "$WORK/check_reports.py" results results/junit.xml "$WORK/main.closing" 0 || die "the main job's reports"

step "the scratch adopter project: its declared requirements, then -n 2 --dist load against the installed wheel"
cp -r "$SRC/examples/adopter_project" "$WORK/project"
cd "$WORK/project"
run "$WORK/project-install.log" "$VPY" -m pip install "${PIP[@]}" -r requirements.txt
t2=$(date +%s)
run "$WORK/project.log" "$VPY" -m pytest -n 2 --dist load --model-path /models/llama -p no:cacheprovider \
  --junitxml=results/junit.xml --conformance-report results/conformance-result.json
project_s=$(( $(date +%s) - t2 ))
grep -E "^=+ .* in [0-9.]+s" "$WORK/project.log" | tail -1 >"$WORK/project.closing"
cat "$WORK/project.closing"
"$VPY" "$WORK/check_reports.py" results results/junit.xml "$WORK/project.closing" 1 || die "the project's reports"

step "reports diff: the result against itself passes, against a copy with one passing case failed reports it"
"$VPY" -m reports diff results/conformance-result.json results/conformance-result.json >"$WORK/diff-same.log" \
  || { cat "$WORK/diff-same.log"; die "reports diff of a result against itself"; }
changed=$("$VPY" - results/conformance-result.json "$WORK/changed.json" <<'PYEOF'
import json, sys
result = json.load(open(sys.argv[1]))
case = next(c for c in result["cases"] if c["status"] == "pass")
case["status"], case["outcome"] = "fail", "failed"
result["summary"]["pass"] -= 1
result["summary"]["fail"] += 1
json.dump(result, open(sys.argv[2], "w"))
print(case["case"])
PYEOF
)
set +e
"$VPY" -m reports diff results/conformance-result.json "$WORK/changed.json" >"$WORK/diff-changed.log" 2>&1
code=$?
set -e
[ "$code" -eq 1 ] && grep -q "$changed" "$WORK/diff-changed.log" \
  || { cat "$WORK/diff-changed.log"; die "reports diff did not report $changed turned fail (exit $code)"; }
echo "  $changed made to fail: reports diff exit 1, $(grep -m1 "$changed" "$WORK/diff-changed.log")"
echo "adopter: ok — main job $main_s s, project run $project_s s, stage $(( $(date +%s) - t0 )) s in all"
