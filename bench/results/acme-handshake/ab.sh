cd /tmp/tlsab
for round in 1 2 3; do
for kind in file acme; do
  taskset -c 0 /work/main/target/release/veloxy run --config $kind.toml > run-$kind.log 2>&1 &
  V=$!
  for i in $(seq 1 50); do (echo > /dev/tcp/127.0.0.1/18443) 2>/dev/null && break; sleep 0.1; done
  taskset -c 1 python3 client.py 200 18443 >/dev/null
  a=$(awk '{print $14+$15}' /proc/$V/stat)
  ok=$(taskset -c 1 python3 client.py 3000 18443)
  b=$(awk '{print $14+$15}' /proc/$V/stat)
  kill $V; wait $V 2>/dev/null
  echo "$round $kind ok=$ok cpu_ticks=$((b-a)) us_per_handshake=$(( (b-a)*10000/ok ))"
done; done
