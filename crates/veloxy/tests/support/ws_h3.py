"""What an RFC 9220 client (aioquic) finds on veloxy's HTTP/3: the SETTINGS_ENABLE_CONNECT_PROTOCOL
the server announces, and what an extended CONNECT with `:protocol = websocket` gets.

Usage: ws_h3.py HOST PORT SNI CA_FILE
Prints one JSON object: {"enable_connect_protocol": value or null, "get": status,
"connect": status, or "reset:CODE", or "timeout"}. Every wait is bounded.
"""

import asyncio
import json
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection, Setting
from aioquic.h3.events import HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import StreamReset


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.waiting = {}

    def quic_event_received(self, event):
        if isinstance(event, StreamReset) and event.stream_id in self.waiting:
            f = self.waiting.pop(event.stream_id)
            if not f.done():
                f.set_result(f"reset:{event.error_code}")
        for e in self.h3.handle_event(event):
            if isinstance(e, HeadersReceived) and e.stream_id in self.waiting:
                f = self.waiting.pop(e.stream_id)
                status = dict(e.headers).get(b":status", b"0")
                if not f.done():
                    f.set_result(int(status))

    async def request(self, headers, end_stream):
        sid = self._quic.get_next_available_stream_id()
        f = asyncio.get_event_loop().create_future()
        self.waiting[sid] = f
        self.h3.send_headers(sid, headers, end_stream=end_stream)
        self.transmit()
        try:
            return await asyncio.wait_for(f, 5)
        except asyncio.TimeoutError:
            return "timeout"


async def main():
    host, port, sni, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=sni)
    config.load_verify_locations(ca)
    out = {}
    async with connect(host, port, configuration=config, create_protocol=Client) as c:
        base = [(b":scheme", b"https"), (b":authority", sni.encode()), (b":path", b"/ws")]
        # An ordinary request first: the server's SETTINGS have arrived by its answer.
        out["get"] = await c.request([(b":method", b"GET")] + base, True)
        settings = c.h3.received_settings or {}
        out["enable_connect_protocol"] = settings.get(Setting.ENABLE_CONNECT_PROTOCOL)
        connect_headers = [(b":method", b"CONNECT"), (b":protocol", b"websocket")] + base + [
            (b"sec-websocket-version", b"13")]
        out["connect"] = await c.request(connect_headers, False)
    print(json.dumps(out))


asyncio.run(asyncio.wait_for(main(), 20))
