#!/usr/bin/env bash
# Runs defparam's smuggler (https://github.com/defparam/smuggler; not on PyPI, so not in CI:
# tests/smuggling.rs is CI's check) against veloxy on three listeners, in front of the test
# upstream, nginx and HAProxy (-> the test upstream), with each of its mutation sets
# (default, exhaustive, doubles). Prints one line per set and upstream; exits 1 on any finding.
#
#   dev/smuggler.sh SMUGGLER_DIR [VELOXY_BIN]      (build first: cargo build -p veloxy -p veloxy-testkit)
set -euo pipefail
SM="${1:?usage: dev/smuggler.sh SMUGGLER_DIR [VELOXY_BIN]}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VX="${2:-$ROOT/target/debug/veloxy}"
UP="$ROOT/target/debug/veloxy-upstream"
W="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
P_UP=$(port); P_NG=$(port); P_HA=$(port); L_UP=$(port); L_NG=$(port); L_HA=$(port)
cat > "$W/nginx.conf" <<NG
daemon off; worker_processes 1; error_log $W/nginx-error.log; pid $W/nginx.pid;
events { worker_connections 256; }
http { access_log off; client_body_temp_path $W/body;
  server { listen 127.0.0.1:$P_NG; location / { return 200 "nginx ok\n"; } } }
NG
printf 'global\n  maxconn 256\ndefaults\n  mode http\n  timeout connect 2s\n  timeout client 10s\n  timeout server 10s\nfrontend fe\n  bind 127.0.0.1:%s\n  default_backend be\nbackend be\n  server u 127.0.0.1:%s\n' "$P_HA" "$P_UP" > "$W/haproxy.cfg"
{
  printf '[server]\nworkers = 1\n'
  for l in up:$L_UP ng:$L_NG ha:$L_HA; do printf '[listeners.%s]\naddr = "127.0.0.1:%s"\n' "${l%%:*}" "${l#*:}"; done
  for u in up:$P_UP ng:$P_NG ha:$P_HA; do
    printf '[[routes]]\nlistener = "%s"\nupstream = "%s"\n[upstreams.%s]\nservers = ["127.0.0.1:%s"]\n' "${u%%:*}" "${u%%:*}" "${u%%:*}" "${u#*:}"
  done
} > "$W/veloxy.toml"
"$UP" --listen "127.0.0.1:$P_UP" > "$W/up.log" 2>&1 &
nginx -c "$W/nginx.conf" -p "$W" > "$W/ng.log" 2>&1 &
haproxy -f "$W/haproxy.cfg" > "$W/ha.log" 2>&1 &
"$VX" run --config "$W/veloxy.toml" > "$W/vx.log" 2>&1 &
for p in $L_UP $L_NG $L_HA; do
  for _ in $(seq 100); do curl -fs -o /dev/null -X POST -d a=b "http://127.0.0.1:$p/" && break; sleep 0.1; done
done
found=0
for cfg in default exhaustive doubles; do
  for l in upstream:$L_UP nginx:$L_NG haproxy:$L_HA; do
    out="$W/$cfg-${l%%:*}.out"
    (cd "$SM" && timeout 3000 python3 smuggler.py -u "http://127.0.0.1:${l#*:}/" -c "$cfg.py" --no-color -t 5 > "$out" 2>&1) || true
    checked=$(grep -o 'Checking TECL' "$out" | wc -l); issues=$(grep -c 'Issue Found' "$out" || true)
    echo "smuggler $cfg, veloxy in front of ${l%%:*}: $checked mutations, $issues findings"
    [ "$checked" -gt 0 ] || { echo "  smuggler did not run: $(tail -c 300 "$out")"; found=1; }
    [ "$issues" -eq 0 ] || found=1
  done
done
exit $found
