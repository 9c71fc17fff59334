#!/usr/bin/env bash
# Stop what dev/kube/start.sh DIR started: both processes, or only the one named
# (`stop.sh DIR kube-apiserver` then `start.sh DIR` restarts the API server on the same port).
# SIGTERM, then SIGKILL after 10 s. Only the pids recorded in DIR are signalled. Keeps DIR
# (etcd's data, certificates, logs); remove it yourself.
set -euo pipefail
[ $# -ge 1 ] || {
  echo "usage: $0 DIR [kube-apiserver|etcd]" >&2
  exit 2
}
DIR="$1"
shift
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(kube-apiserver etcd) # the API server first: it uses etcd

for name in "${names[@]}"; do
  case "$name" in kube-apiserver | etcd) ;; *)
    echo "stop.sh: unknown process $name" >&2
    exit 2
    ;;
  esac
  pidfile="$DIR/$name.pid"
  [ -f "$pidfile" ] || continue
  pid="$(cat "$pidfile")"
  # Only a process that is still the binary we started (the pid may have been reused).
  if kill -0 "$pid" 2>/dev/null && [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == */"$name" ]]; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "stop.sh: $name ($pid) ignored SIGTERM for 10 s: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    echo "stop.sh: stopped $name ($pid)" >&2
  fi
  rm -f "$pidfile"
done
