set -e
D=/tmp/tlsab
cd $D
# pebble HTTPS cert
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj "/CN=pebble test CA" -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" -keyout pkey.pem -out req.csr 2>/dev/null
openssl x509 -req -in req.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 -out pcert.pem -extfile <(printf "subjectAltName=DNS:localhost,IP:127.0.0.1") 2>/dev/null
cat > v.toml <<EOT
[server]
workers = 1
[server.acme]
directory = "https://127.0.0.1:14099/dir"
ca_file = "$D/ca.pem"
storage = "$D/acme"
challenge = "http-01"
[listeners.web]
addr = "127.0.0.1:18443"
[listeners.web.tls]
acme = ["bench.example.test"]
[listeners.plain]
addr = "127.0.0.1:18080"
[[routes]]
respond = { body = "ok" }
EOT
cat > p.json <<EOT
{"pebble": {"listenAddress": "127.0.0.1:14099", "managementListenAddress": "127.0.0.1:15099", "certificate": "$D/pcert.pem", "privateKey": "$D/pkey.pem", "httpPort": 18080, "tlsPort": 18443, "ocspResponderURL": "", "externalAccountBindingRequired": false}}
EOT
pebble-challtestsrv -dns01 127.0.0.1:18053 -http01 "" -https01 "" -tlsalpn01 "" -management 127.0.0.1:18055 -defaultIPv6 "" > dns.log 2>&1 &
DNS=$!
PEBBLE_VA_NOSLEEP=1 pebble -config p.json -dnsserver 127.0.0.1:18053 > pebble.log 2>&1 &
PEB=$!
/work/main/target/release/veloxy run --config v.toml > v.log 2>&1 &
V=$!
for i in $(seq 1 60); do ls acme/*/certs/bench.example.test.crt >/dev/null 2>&1 && break; sleep 1; done
kill $V $PEB $DNS; wait 2>/dev/null || true
ls -la acme/*/certs/
