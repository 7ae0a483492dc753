#!/usr/bin/env bash
# machine_includes_test: the round's state machine (SiteMachine and its
# roles) and every project header it reaches include no gRPC, OpenSSL,
# thread, mutex or condition-variable header: the machine never blocks, locks
# or does I/O; its caller (SiteDriver) does. Headers of the libraries below
# (Abseil's Status, Protobuf) are not followed.
#   check_machine_includes.sh SOURCE_ROOT
set -euo pipefail
root=$1
cd "$root"
forbidden='^#include [<"](grpc|grpcpp|openssl/|thread>|mutex>|shared_mutex>|condition_variable>|future>|absl/synchronization/)'
# Every file of the machine (site_machine*.cc and the roles, *_role*.cc, but
# their tests), so that a new role file is checked without being listed here.
todo=(controller/site_machine.h controller/trainer_task.cc controller/fan_out.cc)
for file in controller/site_machine*.cc controller/*_role*.cc; do
  case "$file" in *_test.cc) ;; *) todo+=("$file") ;; esac
done
declare -A seen=()
failed=0
while [ "${#todo[@]}" -gt 0 ]; do
  file=${todo[0]}
  todo=("${todo[@]:1}")
  [ -n "${seen[$file]:-}" ] && continue
  seen[$file]=1
  if bad=$(grep -nE "$forbidden" "$file"); then
    echo "FAIL: $file: $bad" >&2
    failed=1
  fi
  # Follow the project's own headers ("dir/name.h" that exists here).
  while IFS= read -r header; do
    [ -f "$header" ] && todo+=("$header")
  done < <(sed -nE 's/^#include "([^"]+)".*/\1/p' "$file")
done
if [ "$failed" -ne 0 ]; then exit 1; fi
echo "ok: ${#seen[@]} files of the machine and the headers it reaches include no gRPC, OpenSSL, thread, mutex or condition-variable header"
