#!/usr/bin/env bash
# swarmctl init --local 3: runs the printed commands exactly as printed (the
# indented lines) and expects the job done on every site and the best model
# fetched; a second init into the same folder is refused, naming it, and
# changes nothing; --force writes into it.
#   init_local_test.sh SWARMCTL
set -u
CTL=$1
TMP=$(mktemp -d "${TMPDIR:-/tmp}/init-local-XXXXXX")
OUT="$TMP/trial"
fail() { echo "FAIL: $*" >&2; echo "kept $TMP" >&2; exit 1; }

"$CTL" init --local 3 --learner test --rounds 3 --job-id init-trial \
  --out "$OUT" >"$TMP/init.txt" 2>"$TMP/init.err" || fail "init exited $?: $(cat "$TMP/init.err")"
for f in job.json ca/ca.crt admins/admin/cert.pem sites/site-1/site.json \
         sites/site-1/key.pem sites/site-3/cert.pem; do
  [ -f "$OUT/$f" ] || fail "init did not write $f"
done
before=$(md5sum "$OUT/job.json")
"$CTL" init --local 2 --learner test --out "$OUT" >/dev/null 2>"$TMP/again.err"
[ $? -eq 2 ] || fail "init into an existing folder should exit 2"
grep -q "$OUT exists" "$TMP/again.err" || fail "the refusal does not name $OUT: $(cat "$TMP/again.err")"
[ "$(md5sum "$OUT/job.json")" = "$before" ] || fail "the refused init changed job.json"
"$CTL" init --local 3 --learner nope --out "$TMP/bad" >/dev/null 2>"$TMP/bad.err"
[ $? -eq 2 ] && grep -q -- "--learner nope" "$TMP/bad.err" || fail "a bad --learner is not refused by name"
[ ! -e "$TMP/bad" ] || fail "a refused init left $TMP/bad"

# The printed commands, as printed; the daemons are stopped at the end.
{
  echo 'set -e'
  echo 'trap '"'"'kill $(jobs -p) 2>/dev/null; wait'"'"' EXIT'
  grep '^  ' "$TMP/init.txt"
} >"$TMP/run.sh"
timeout 240 bash "$TMP/run.sh" >"$TMP/run.out" 2>&1 || fail "the printed commands failed: $(tail -20 "$TMP/run.out")"
grep -q "done on every site" "$TMP/run.out" || fail "the job did not finish: $(tail -20 "$TMP/run.out")"
[ -s "$OUT/best.safetensors" ] || fail "no best model fetched"
"$CTL" init --local 3 --learner test --out "$OUT" --force >/dev/null || fail "--force was refused"
echo "PASS: init --local ran as printed"
rm -rf "$TMP"
