"""An independent HTTP/3 client (aioquic) for veloxy's interop test.

Usage: h3_get.py HOST PORT SNI CA_FILE PATH
Prints the status on the first line, then the body. Exits 1 on any failure.
"""

import asyncio
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.status = None
        self.body = b""
        self.done = asyncio.get_event_loop().create_future()

    def quic_event_received(self, event):
        for e in self.h3.handle_event(event):
            if isinstance(e, HeadersReceived):
                for k, v in e.headers:
                    if k == b":status":
                        self.status = int(v)
            elif isinstance(e, DataReceived):
                self.body += e.data
            if getattr(e, "stream_ended", False) and not self.done.done():
                self.done.set_result(True)

    async def get(self, authority, path):
        sid = self._quic.get_next_available_stream_id()
        self.h3.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"https"),
                                   (b":authority", authority.encode()), (b":path", path.encode())],
                             end_stream=True)
        self.transmit()
        await asyncio.wait_for(self.done, 10)


async def main():
    host, port, sni, ca, path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=sni)
    config.load_verify_locations(ca)
    async with connect(host, port, configuration=config, create_protocol=Client) as c:
        await c.get(sni, path)
        print(c.status)
        sys.stdout.write(c.body.decode(errors="replace"))


asyncio.run(asyncio.wait_for(main(), 20))
