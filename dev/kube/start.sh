#!/usr/bin/env bash
# Start a real etcd + kube-apiserver for the Kubernetes provider's tests (issue 37).
#
#   dev/kube/start.sh DIR        (binaries: bash .ci/kube.sh builds them once per machine)
#   dev/kube/stop.sh DIR [kube-apiserver|etcd]
#
# Everything lives in DIR: certificates, keys, the token file, etcd's data, logs
# (etcd.log, kube-apiserver.log), pid files (etcd.pid, kube-apiserver.pid), ports, and for
# clients DIR/kubeconfig, DIR/ca.crt and DIR/env (shell-sourceable):
#   APISERVER_URL  https://ADDR:PORT
#   TOKEN          bearer token of user "admin" in group system:masters (cluster-admin)
#   USER_TOKEN     bearer token of user "veloxy-test-user": authenticated, no RBAC grant
#   CA_FILE        DIR/ca.crt, the CA that signed the serving certificate
#   KUBECONFIG     DIR/kubeconfig (CA data and the admin token inline)
#   ETCD_URL       http://ADDR:PORT
# and prints APISERVER_URL on its last line of standard output.
#
# Ports: free ephemeral ports picked by binding port 0 (etcd client, etcd peer, apiserver);
# etcd is retried on other ports if it cannot bind. Startup waits for etcd's /health and
# the apiserver's /readyz (polled, deadline $VELOXY_KUBE_START_TIMEOUT seconds, default 90).
#
# Re-running start.sh on a DIR whose processes are alive does nothing but print the URL; a DIR
# whose kube-apiserver was stopped (stop.sh DIR kube-apiserver) gets it back on the same port
# with the same certificates and tokens: this is how a test restarts the API server.
#
# Environment:
#   VELOXY_KUBE_ADDRESS  the address everything binds to and advertises (default 127.0.0.1;
#                        in a test network namespace e.g. 192.0.2.1, which must be on `lo`)
#   VELOXY_CACHE         default ~/.cache/veloxy (binaries in $VELOXY_CACHE/bin)
#   VELOXY_ETCD_BIN, VELOXY_KUBE_APISERVER_BIN  override the binaries
#   VELOXY_KUBE_APISERVER_ARGS  extra kube-apiserver flags (word-split)
#
# Without a controller-manager: the ServiceAccount admission plugin is disabled (no token
# controller), on 127.0.0.1 the endpoint reconciler is off (no Endpoints for the "kubernetes"
# Service: a loopback advertise address is refused there), and a
# deleted Namespace stays Terminating (no namespace controller): tests delete objects, not
# namespaces. Garbage collection (ownerReferences) does not run either.
set -euo pipefail

die() {
  echo "start.sh: $*" >&2
  exit 1
}
[ $# -ge 1 ] || die "usage: $0 DIR"
mkdir -p "$1"
DIR="$(cd "$1" && pwd)"
cache="${VELOXY_CACHE:-$HOME/.cache/veloxy}"
ETCD="${VELOXY_ETCD_BIN:-$cache/bin/etcd}"
APISERVER="${VELOXY_KUBE_APISERVER_BIN:-$cache/bin/kube-apiserver}"
ADDR="${VELOXY_KUBE_ADDRESS:-127.0.0.1}"
DEADLINE_S="${VELOXY_KUBE_START_TIMEOUT:-90}"
[ -x "$ETCD" ] || die "no etcd at $ETCD: run 'bash .ci/kube.sh' first"
[ -x "$APISERVER" ] || die "no kube-apiserver at $APISERVER: run 'bash .ci/kube.sh' first"
for t in openssl curl python3; do command -v $t >/dev/null || die "$t not found"; done

t_start=$(date +%s.%N)
now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$(now)"; }
alive() { [ -f "$DIR/$1.pid" ] && kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null; }

# free_ports N: N distinct free TCP ports on $ADDR (all held while picking, then released).
free_ports() {
  python3 - "$ADDR" "$1" <<'EOF'
import socket, sys
addr, n = sys.argv[1], int(sys.argv[2])
fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
socks = []
for _ in range(n):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.bind((addr, 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# hostport PORT: ADDR:PORT, bracketed for IPv6.
hostport() { if [[ "$ADDR" == *:* ]]; then echo "[$ADDR]:$1"; else echo "$ADDR:$1"; fi; }

# --- credentials (made once per DIR) ----------------------------------------------------------
if [ ! -f "$DIR/apiserver.crt" ] || [ ! -f "$DIR/tokens.csv" ]; then
  (
    cd "$DIR"
    umask 077
    # A CA and a serving certificate it signs (a self-signed leaf used as its own CA is refused
    # by webpki/rustls as CaUsedAsEndEntity, so the serving certificate is not a CA).
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
      -keyout ca.key -out ca.crt -subj "/CN=veloxy-test-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      2>/dev/null
    if [[ "$ADDR" == *:* ]]; then san="IP:$ADDR,IP:::1"; else san="IP:$ADDR"; fi
    [ "$ADDR" = 127.0.0.1 ] || san="$san,IP:127.0.0.1"
    san="$san,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
    printf '%s\n' "basicConstraints=critical,CA:FALSE" \
      "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" \
      "subjectAltName=$san" >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    rm -f apiserver.csr apiserver.ext ca.srl
    # Service account token signing key.
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
    openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
    # Static tokens: token,user,uid,"group1,group2"
    admin="$(openssl rand -hex 24)"
    user="$(openssl rand -hex 24)"
    printf '%s,admin,admin-uid,"system:masters"\n%s,veloxy-test-user,veloxy-test-user-uid\n' \
      "$admin" "$user" >tokens.csv.tmp
    mv tokens.csv.tmp tokens.csv
    chmod 644 ca.crt apiserver.crt sa.pub
  ) || die "generating certificates and tokens in $DIR failed"
fi
TOKEN="$(sed -n '1s/,.*//p' "$DIR/tokens.csv")"
USER_TOKEN="$(sed -n '2s/,.*//p' "$DIR/tokens.csv")"

# --- etcd -------------------------------------------------------------------------------------
etcd_health() { curl -fsS --max-time 2 "http://$(hostport "$1")/health" 2>/dev/null | grep -q '"health":"true"'; }

if alive etcd; then
  read -r ETCD_PORT _ <"$DIR/etcd.ports"
else
  ok=0
  for attempt in 1 2 3; do
    if [ "$attempt" = 1 ] && [ -f "$DIR/etcd.ports" ]; then
      read -r ETCD_PORT ETCD_PEER_PORT <"$DIR/etcd.ports" # a restart keeps etcd's URLs
    else
      read -r ETCD_PORT ETCD_PEER_PORT <<<"$(free_ports 2)"
    fi
    curl_url="http://$(hostport "$ETCD_PORT")"
    peer_url="http://$(hostport "$ETCD_PEER_PORT")"
    echo "== etcd (attempt $attempt): client $curl_url, peer $peer_url" >>"$DIR/etcd.log"
    # setsid: its own session, so the caller's job control or terminal does not signal it.
    setsid "$ETCD" --name veloxy-test --data-dir "$DIR/etcd-data" \
      --listen-client-urls "$curl_url" --advertise-client-urls "$curl_url" \
      --listen-peer-urls "$peer_url" --initial-advertise-peer-urls "$peer_url" \
      --initial-cluster "veloxy-test=$peer_url" --initial-cluster-state new \
      --unsafe-no-fsync --log-level warn \
      </dev/null >>"$DIR/etcd.log" 2>&1 &
    echo $! >"$DIR/etcd.pid"
    end=$(($(date +%s) + 20))
    while [ "$(date +%s)" -lt "$end" ] && alive etcd; do
      if etcd_health "$ETCD_PORT"; then
        ok=1
        break
      fi
      sleep 0.05
    done
    [ "$ok" = 1 ] && break
    kill "$(cat "$DIR/etcd.pid")" 2>/dev/null || true
    wait "$(cat "$DIR/etcd.pid")" 2>/dev/null || true
    rm -f "$DIR/etcd.pid"
  done
  if [ "$ok" != 1 ]; then
    tail -n 20 "$DIR/etcd.log" >&2
    die "etcd did not become healthy (log: $DIR/etcd.log)"
  fi
  echo "$ETCD_PORT $ETCD_PEER_PORT" >"$DIR/etcd.ports"
fi
ETCD_URL="http://$(hostport "$ETCD_PORT")"
t_etcd=$(elapsed "$t_start")

# --- kube-apiserver ---------------------------------------------------------------------------
# port_free PORT: nothing listens on ADDR:PORT (bind test).
port_free() {
  python3 -c 'import socket, sys
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))' "$ADDR" "$1" 2>/dev/null
}

if [ -f "$DIR/apiserver.port" ] && { alive kube-apiserver || port_free "$(cat "$DIR/apiserver.port")"; }; then
  API_PORT="$(cat "$DIR/apiserver.port")" # a restart keeps the URL that clients hold
else
  read -r API_PORT <<<"$(free_ports 1)"
  echo "$API_PORT" >"$DIR/apiserver.port"
fi
APISERVER_URL="https://$(hostport "$API_PORT")"

readyz() {
  curl -fsS --max-time 2 --cacert "$DIR/ca.crt" -H "Authorization: Bearer $TOKEN" \
    "$APISERVER_URL/readyz" 2>/dev/null | grep -qx ok
}

# The "kubernetes" Service's Endpoints would hold the advertise address, refused when loopback.
case "$ADDR" in 127.* | ::1) reconciler=none ;; *) reconciler=lease ;; esac

if ! alive kube-apiserver; then
  # shellcheck disable=SC2086 # VELOXY_KUBE_APISERVER_ARGS is word-split on purpose
  setsid "$APISERVER" \
    --etcd-servers="$ETCD_URL" \
    --bind-address="$ADDR" --advertise-address="$ADDR" --secure-port="$API_PORT" \
    --tls-cert-file="$DIR/apiserver.crt" --tls-private-key-file="$DIR/apiserver.key" \
    --token-auth-file="$DIR/tokens.csv" \
    --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$DIR/sa.pub" --service-account-signing-key-file="$DIR/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 \
    --disable-admission-plugins=ServiceAccount \
    --endpoint-reconciler-type="$reconciler" \
    --profiling=false \
    ${VELOXY_KUBE_APISERVER_ARGS:-} \
    </dev/null >>"$DIR/kube-apiserver.log" 2>&1 &
  echo $! >"$DIR/kube-apiserver.pid"
fi

end=$(($(date +%s) + DEADLINE_S))
until readyz; do
  if ! alive kube-apiserver; then
    tail -n 30 "$DIR/kube-apiserver.log" >&2
    die "kube-apiserver exited (log: $DIR/kube-apiserver.log)"
  fi
  if [ "$(date +%s)" -ge "$end" ]; then
    tail -n 30 "$DIR/kube-apiserver.log" >&2
    die "kube-apiserver not ready after ${DEADLINE_S}s (log: $DIR/kube-apiserver.log; stop it with dev/kube/stop.sh $DIR)"
  fi
  sleep 0.1
done

# --- client files -----------------------------------------------------------------------------
ca_data="$(base64 -w0 <"$DIR/ca.crt")"
cat >"$DIR/kubeconfig.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: veloxy-test
  cluster:
    server: $APISERVER_URL
    certificate-authority-data: $ca_data
users:
- name: admin
  user:
    token: $TOKEN
contexts:
- name: veloxy-test
  context:
    cluster: veloxy-test
    user: admin
    namespace: default
current-context: veloxy-test
EOF
mv "$DIR/kubeconfig.tmp" "$DIR/kubeconfig"
cat >"$DIR/env.tmp" <<EOF
APISERVER_URL=$APISERVER_URL
TOKEN=$TOKEN
USER_TOKEN=$USER_TOKEN
CA_FILE=$DIR/ca.crt
KUBECONFIG=$DIR/kubeconfig
ETCD_URL=$ETCD_URL
EOF
mv "$DIR/env.tmp" "$DIR/env"
echo "start.sh: etcd ready at ${t_etcd}s, kube-apiserver ready in $(elapsed "$t_start")s (logs and pids in $DIR; stop with dev/kube/stop.sh $DIR)" >&2
echo "$APISERVER_URL"
