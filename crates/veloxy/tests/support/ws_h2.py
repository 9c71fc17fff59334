#!/usr/bin/env python3
"""A WebSocket client over HTTP/2 (RFC 8441), by the `h2` and `wsproto` packages.

usage: ws_h2.py HOST PORT AUTHORITY PATH [--tls CA_PEM] [--protocol NAME] [--big N]
                [--header NAME:VALUE]... [--hold SECONDS]

Connects (h2c prior knowledge, or TLS with ALPN h2), checks the server's SETTINGS offer
SETTINGS_ENABLE_CONNECT_PROTOCOL, opens an extended CONNECT with `:protocol = NAME`
(default websocket) and, when the answer is 200, sends a text message "hello", a binary
message of N bytes (default 100000), then a close frame (1000), and reads the echoes and
the close answer. Prints one JSON object: the settings flag, the status and response fields,
whether each echo
came back intact, the close code received. With --hold, after the echoes it sends "ping"
every 0.3 s for SECONDS (each must come back: "held"), then stays silent and reports after
how long the server ended the stream ("ended_after", null if it did not within 10 s)
instead of closing. Every wait is bounded.
"""

import json
import socket
import ssl
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.settings
from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, TextMessage

DEADLINE = time.monotonic() + 10


def main():
    host, port, authority, path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    args = sys.argv[5:]
    ca = args[args.index("--tls") + 1] if "--tls" in args else None
    proto = args[args.index("--protocol") + 1] if "--protocol" in args else "websocket"
    big = int(args[args.index("--big") + 1]) if "--big" in args else 100000
    hold = float(args[args.index("--hold") + 1]) if "--hold" in args else None
    global DEADLINE
    DEADLINE += 2 * (hold or 0) + 10
    extra = []
    for i, a in enumerate(args):
        if a == "--header":
            name, value = args[i + 1].split(":", 1)
            extra.append((name, value))
    sock = socket.create_connection((host, port), timeout=10)
    if ca:
        ctx = ssl.create_default_context(cafile=ca)
        ctx.set_alpn_protocols(["h2"])
        sock = ctx.wrap_socket(sock, server_hostname=authority.split(":")[0])
        assert sock.selected_alpn_protocol() == "h2", sock.selected_alpn_protocol()
    out = {"enable_connect_protocol": False, "status": None}
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    pending = []  # events read but not yet handled

    def events():
        while True:
            if pending:
                yield pending.pop(0)
                continue
            if time.monotonic() > DEADLINE:
                raise TimeoutError("no answer in time")
            data = sock.recv(65536)
            if not data:
                raise EOFError("connection closed")
            pending.extend(conn.receive_data(data))
            sock.sendall(conn.data_to_send())

    for ev in events():
        if isinstance(ev, h2.events.RemoteSettingsChanged):
            flag = ev.changed_settings.get(h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL)
            out["enable_connect_protocol"] = bool(flag and flag.new_value == 1)
            break
    scheme = "https" if ca else "http"
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [
        (":method", "CONNECT"), (":protocol", proto), (":scheme", scheme),
        (":path", path), (":authority", authority),
        ("sec-websocket-version", "13"), ("origin", f"{scheme}://{authority}"),
    ] + extra)
    sock.sendall(conn.data_to_send())
    for ev in events():
        if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
            out["status"] = int(dict(ev.headers)[b":status"])
            out["headers"] = {k.decode(): v.decode() for k, v in ev.headers}
            break
        if isinstance(ev, h2.events.StreamReset) and ev.stream_id == sid:
            out["reset"] = int(ev.error_code)
            break
    if out["status"] != 200:
        print(json.dumps(out))
        return
    ws = Connection(ConnectionType.CLIENT)
    payload = bytes(i % 251 for i in range(big))

    def send(data):
        # Within the stream's and the connection's flow-control windows.
        while data:
            window = conn.local_flow_control_window(sid)
            if window == 0:
                for ev in events():
                    if isinstance(ev, h2.events.WindowUpdated):
                        break
                    pending_ws.append(ev)
                continue
            n = min(window, conn.max_outbound_frame_size, len(data))
            conn.send_data(sid, data[:n])
            sock.sendall(conn.data_to_send())
            data = data[n:]

    pending_ws = []
    got_text, got_bin, close = None, bytearray(), None
    send(ws.send(TextMessage(data="hello")))
    send(ws.send(BytesMessage(data=payload)))
    sent_close = False
    while close is None:
        ev = pending_ws.pop(0) if pending_ws else next(events())
        if isinstance(ev, h2.events.DataReceived) and ev.stream_id == sid:
            conn.acknowledge_received_data(ev.flow_controlled_length, sid)
            sock.sendall(conn.data_to_send())
            ws.receive_data(ev.data)
            for w in ws.events():
                if isinstance(w, TextMessage):
                    got_text = (got_text or "") + w.data
                elif isinstance(w, BytesMessage):
                    got_bin += w.data
                elif isinstance(w, CloseConnection):
                    close = w.code
        elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
            if getattr(ev, "stream_id", sid) == sid:
                break
        if got_text is not None and len(got_bin) >= len(payload) and not sent_close:
            if hold is not None:
                close = "held"
                break
            send(ws.send(CloseConnection(code=1000)))
            sent_close = True
    out["text_echo"] = got_text == "hello"
    out["binary_echo"] = bytes(got_bin) == payload
    out["close_code"] = close
    if hold is not None:

        def next_text():
            # The next text message, None once the stream or connection has ended, False when
            # nothing came within the socket's 10 s.
            try:
                while True:
                    ev = pending_ws.pop(0) if pending_ws else next(events())
                    if isinstance(ev, h2.events.DataReceived) and ev.stream_id == sid:
                        conn.acknowledge_received_data(ev.flow_controlled_length, sid)
                        sock.sendall(conn.data_to_send())
                        ws.receive_data(ev.data)
                        for w in ws.events():
                            if isinstance(w, TextMessage):
                                return w.data
                    elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                        if ev.stream_id == sid:
                            return None
                    elif isinstance(ev, h2.events.ConnectionTerminated):
                        return None
            except (TimeoutError, socket.timeout):
                return False  # nothing within the wait: still open
            except (EOFError, OSError):
                return None

        end = time.monotonic() + hold
        held = True
        while time.monotonic() < end:
            time.sleep(0.3)
            send(ws.send(TextMessage(data="ping")))
            if next_text() != "ping":
                held = False
                break
        out["held"] = held
        t0 = time.monotonic()
        ended = next_text() is None
        out["ended_after"] = round(time.monotonic() - t0, 2) if ended else None
        print(json.dumps(out))
        return
    conn.end_stream(sid)
    sock.sendall(conn.data_to_send())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
