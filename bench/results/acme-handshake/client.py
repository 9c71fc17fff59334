import socket, ssl, sys, time
n = int(sys.argv[1]); port = int(sys.argv[2])
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["http/1.1"])
ok = 0; t0 = time.time()
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    t = ctx.wrap_socket(s, server_hostname="bench.example.test")
    t.sendall(b"GET / HTTP/1.1\r\nHost: bench.example.test\r\nConnection: close\r\n\r\n")
    data = b""
    while True:
        d = t.recv(4096)
        if not d: break
        data += d
    if b" 200 " in data and data.endswith(b"ok"): ok += 1
    t.close()
    if time.time() - t0 > 60: break
print(ok)
