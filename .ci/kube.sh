#!/usr/bin/env bash
# A real kube-apiserver and etcd for the Kubernetes provider's tests (issue 37), built from the
# Go module proxy only and cached under ~/.cache/veloxy/bin, so a machine builds them once:
#   kube-apiserver  k8s.io/kubernetes $KUBE_VERSION, through a wrapper module that replaces each
#                   k8s.io/* staging module (v0.0.0 => ./staging/...) with its published v0.X.Y
#   etcd            go.etcd.io/etcd/server/v3 $ETCD_VERSION, through a wrapper main calling
#                   etcdmain.Main (the etcd root module's own main)
# Idempotent: a binary whose stamp file names the same version (and wrapper revision) is kept.
# The build runs under `nice -n 19`. Module cache: $VELOXY_CACHE/go (the GOPATH that the bench
# harness uses for traefik). Logs: $VELOXY_CACHE/logs/{kube-apiserver,etcd}-build.log.
# Exits non-zero only when a binary is missing afterwards. Usage: bash .ci/kube.sh [--force]
set -euo pipefail

KUBE_VERSION="${VELOXY_KUBE_VERSION:-v1.34.4}"
ETCD_VERSION="${VELOXY_ETCD_VERSION:-v3.6.16}"
WRAPPER_REV=1 # bump when the wrapper modules or build flags change

cache="${VELOXY_CACHE:-$HOME/.cache/veloxy}"
bin="$cache/bin"
logs="$cache/logs"
mkdir -p "$bin" "$logs" "$cache/src"

force=0
[ "${1:-}" = "--force" ] && force=1

say() { echo "== kube.sh: $*"; }
fail() {
  echo "kube.sh: FAILED: $*" >&2
  exit 1
}

command -v go >/dev/null || fail "go not found"
export GOPATH="$cache/go"
export GOFLAGS="-modcacherw -buildvcs=false"
export GOTOOLCHAIN=local
export CGO_ENABLED=0

# up_to_date NAME STAMP: the binary exists and its stamp file holds STAMP.
up_to_date() {
  [ "$force" = 0 ] && [ -x "$bin/$1" ] && [ -f "$bin/$1.stamp" ] && [ "$(cat "$bin/$1.stamp")" = "$2" ]
}

# A stage that fails prints its log's tail and returns non-zero.
run_logged() {
  local log="$1"
  shift
  echo "\$ $*" >>"$log"
  if ! "$@" >>"$log" 2>&1; then
    echo "kube.sh: command failed: $* (last lines of $log):" >&2
    tail -n 25 "$log" >&2
    return 1
  fi
}

# --- etcd ----------------------------------------------------------------------------------
build_etcd() {
  local stamp="etcd $ETCD_VERSION rev $WRAPPER_REV"
  if up_to_date etcd "$stamp"; then
    say "etcd $ETCD_VERSION: cached ($bin/etcd)"
    return 0
  fi
  local src="$cache/src/etcd-$ETCD_VERSION" log="$logs/etcd-build.log" t0=$SECONDS
  say "building etcd $ETCD_VERSION into $bin (once per machine; log: $log)"
  : >"$log"
  rm -rf "$src"
  mkdir -p "$src"
  cat >"$src/main.go" <<'EOF'
// etcd, as the etcd root module's main.go builds it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
EOF
  (
    cd "$src"
    run_logged "$log" go mod init veloxy.local/etcd &&
      run_logged "$log" go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION" &&
      run_logged "$log" go mod tidy &&
      run_logged "$log" nice -n 19 go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" .
  ) || return 1
  mv -f "$bin/etcd.tmp" "$bin/etcd"
  echo "$stamp" >"$bin/etcd.stamp"
  say "etcd built in $((SECONDS - t0)) s: $("$bin/etcd" --version | head -1) ($(du -h "$bin/etcd" | cut -f1))"
}

# --- kube-apiserver ------------------------------------------------------------------------
build_kube_apiserver() {
  local stamp="kube-apiserver $KUBE_VERSION rev $WRAPPER_REV"
  if up_to_date kube-apiserver "$stamp"; then
    say "kube-apiserver $KUBE_VERSION: cached ($bin/kube-apiserver)"
    return 0
  fi
  local src="$cache/src/kube-apiserver-$KUBE_VERSION" log="$logs/kube-apiserver-build.log" t0=$SECONDS
  local staging="v0.${KUBE_VERSION#v1.}" # v1.34.4 -> v0.34.4
  say "building kube-apiserver $KUBE_VERSION into $bin (once per machine, about 10-15 min on 2 cores; log: $log)"
  : >"$log"
  # k8s.io/kubernetes's own go.mod lists its staging modules as `k8s.io/X => ./staging/src/k8s.io/X`.
  local modfile
  go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" >>"$log" 2>&1 || true
  modfile="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' "$log" | tail -n 1)"
  if [ -z "$modfile" ] || [ ! -f "$modfile" ]; then
    echo "kube.sh: go mod download k8s.io/kubernetes@$KUBE_VERSION failed (last lines of $log):" >&2
    tail -n 20 "$log" >&2
    return 1
  fi
  rm -rf "$src"
  mkdir -p "$src"
  {
    echo "module veloxy.local/kube-apiserver"
    echo
    echo "go 1.24.0"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "replace ("
    sed -n 's|^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*$|\t\1 => \1 '"$staging"'|p' "$modfile"
    echo ")"
  } >"$src/go.mod"
  grep -q 'k8s.io/apiserver =>' "$src/go.mod" || {
    echo "kube.sh: no staging replace found in $modfile" >&2
    return 1
  }
  cat >"$src/main.go" <<'EOF'
// kube-apiserver, as k8s.io/kubernetes/cmd/kube-apiserver/apiserver.go builds it.
package main

import (
	"os"
	_ "time/tzdata" // for timeZone support in CronJob

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // load all the prometheus client-go plugins
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	command := app.NewAPIServerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
EOF
  # The version that /version reports (the build otherwise says v0.0.0-master).
  local minor="${KUBE_VERSION#v1.}"
  minor="${minor%%.*}"
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld="$ld -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  (
    cd "$src"
    run_logged "$log" go mod tidy &&
      run_logged "$log" nice -n 19 go build -trimpath -ldflags "$ld" -o "$bin/kube-apiserver.tmp" .
  ) || return 1
  mv -f "$bin/kube-apiserver.tmp" "$bin/kube-apiserver"
  echo "$stamp" >"$bin/kube-apiserver.stamp"
  say "kube-apiserver built in $((SECONDS - t0)) s: $("$bin/kube-apiserver" --version) ($(du -h "$bin/kube-apiserver" | cut -f1))"
}

t_all=$SECONDS
ok=1
build_etcd || ok=0
build_kube_apiserver || ok=0
# The Gateway API CRDs (tests install them into the API server, offline in their network
# namespace): fetched once into the cache.
bash "$(dirname "$0")/../dev/kube/gateway-crds.sh" --fetch || ok=0
[ "$ok" = 1 ] || fail "see the messages above"
say "ready in $((SECONDS - t_all)) s: $bin/etcd $bin/kube-apiserver"
