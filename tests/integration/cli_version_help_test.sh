#!/usr/bin/env bash
# --version on both programs (release version as in the top CMakeLists.txt,
# git commit, wire protocol) and --help on every swarmctl subcommand.
#   cli_version_help_test.sh SWARMCTL SWARM_CLIENT SOURCE_DIR
set -u
CTL=$1 CLIENT=$2 SRC=$3
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }

release=$(sed -n 's/^project(swarm VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")
[ -n "$release" ] || bad "no project(swarm VERSION ...) in CMakeLists.txt"

check_version() {  # program-name output
  local name=$1 out=$2
  grep -qx "$name $release" <<<"$out" || bad "$name --version: no line '$name $release' in: $out"
  grep -q '^git commit [0-9a-z-]\+$' <<<"$out" || bad "$name --version: no git commit line in: $out"
  grep -q '^wire protocol [0-9]\+\.[0-9]\+$' <<<"$out" || bad "$name --version: no wire protocol line in: $out"
}
check_version swarmctl "$("$CTL" --version)"
check_version swarmctl "$("$CTL" version)"
check_version swarm-client "$("$CLIENT" --version)"
"$CLIENT" --help | grep -q -- '--version' || bad "swarm-client --help does not list --version"

for cmd in init start resume status abort fetch provision health deploy report version; do
  out=$("$CTL" "$cmd" --help) || bad "swarmctl $cmd --help exited $?"
  grep -q "swarmctl $cmd" <<<"$out" || bad "swarmctl $cmd --help does not show its usage: $out"
  grep -q -- '--tls-dir' <<<"$out" || bad "swarmctl $cmd --help does not show the common flags"
done
"$CTL" deploy k8s --help | grep -q -- '--pki' || bad "swarmctl deploy k8s --help lacks --pki"
"$CTL" start --help | grep -q -- '--rerun-finished' || bad "swarmctl start --help lacks --rerun-finished"
"$CTL" nosuch --help >/dev/null 2>&1
[ $? -eq 2 ] || bad "swarmctl nosuch --help should exit 2"
"$CTL" --help | grep -q 'swarmctl init' || bad "swarmctl --help lacks init"

[ $fail -eq 0 ] && echo "PASS: versions and help"
exit $fail
