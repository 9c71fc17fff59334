#!/usr/bin/env bash
# A real OpenTelemetry Collector for the tracing tests (issue 40), built from the Go module proxy
# once per machine and cached under ~/.cache/veloxy/bin: the wrapper main in dev/otelcol (the
# core OTLP receiver and the contrib file exporter, all collector modules at one release).
# Idempotent: a binary whose stamp file names the same version (and wrapper revision) is kept.
# The build runs under `nice -n 19`. Module cache: $VELOXY_CACHE/go. Log:
# $VELOXY_CACHE/logs/otelcol-build.log. Exits non-zero only when the binary is missing
# afterwards. Usage: bash .ci/otelcol.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/.."

OTELCOL_VERSION=v0.161.0 # the release named in dev/otelcol/go.mod
WRAPPER_REV=4            # bump when dev/otelcol or the build flags change

cache="${VELOXY_CACHE:-$HOME/.cache/veloxy}"
bin="$cache/bin"
logs="$cache/logs"
mkdir -p "$bin" "$logs" "$cache/src"

command -v go >/dev/null || { echo "otelcol.sh: go not found" >&2; exit 1; }
export GOPATH="$cache/go"
export GOFLAGS="-modcacherw -buildvcs=false"
export GOTOOLCHAIN=local
export CGO_ENABLED=0

stamp="otelcol $OTELCOL_VERSION rev $WRAPPER_REV"
if [ "${1:-}" != "--force" ] && [ -x "$bin/otelcol" ] && [ -f "$bin/otelcol.stamp" ] &&
  [ "$(cat "$bin/otelcol.stamp")" = "$stamp" ]; then
  echo "== otelcol.sh: otelcol $OTELCOL_VERSION: cached ($bin/otelcol)"
  exit 0
fi
src="$cache/src/otelcol-$OTELCOL_VERSION"
log="$logs/otelcol-build.log"
t0=$SECONDS
echo "== otelcol.sh: building otelcol $OTELCOL_VERSION into $bin (once per machine; log: $log)"
: >"$log"
rm -rf "$src"
mkdir -p "$src"
cp dev/otelcol/main.go dev/otelcol/go.mod dev/otelcol/go.sum "$src/"
if ! (cd "$src" && go mod tidy >>"$log" 2>&1 &&
  nice -n 19 go build -trimpath -ldflags "-s -w" -o "$bin/otelcol.tmp" . >>"$log" 2>&1); then
  echo "otelcol.sh: FAILED (last lines of $log):" >&2
  tail -n 25 "$log" >&2
  exit 1
fi
mv -f "$bin/otelcol.tmp" "$bin/otelcol"
echo "$stamp" >"$bin/otelcol.stamp"
echo "== otelcol.sh: built in $((SECONDS - t0)) s ($(du -h "$bin/otelcol" | cut -f1))"
