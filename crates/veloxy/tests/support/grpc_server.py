"""A gRPC server (Python grpcio) for tests/grpc_web.rs: generic handlers with bytes in and
out, so no protoc is needed. Prints its port on the first line of stdout once it serves, and
stops when its stdin closes.

  /test.Web/Echo   unary: the request back; initial metadata says what the server saw
                   (x-seen-content-type, x-seen-grpc-web: the client's x-grpc-web or "absent")
  /test.Web/Many   server streaming: the request is a count N; N messages "message i"
  /test.Web/Fail   server streaming: one message, then RESOURCE_EXHAUSTED "ran dry" with the
                   trailing metadata x-custom-trailer: custom-value
  /test.Web/Deny   unary: PERMISSION_DENIED "not you" at once (a trailers-only answer)
"""
import sys
from concurrent import futures

import grpc


def seen(context):
    md = {k: v for k, v in context.invocation_metadata()}
    return (
        ("x-seen-content-type", md.get("content-type", "(not shown)")),
        ("x-seen-grpc-web", md.get("x-grpc-web", "absent")),
    )


def echo(request, context):
    context.send_initial_metadata(seen(context))
    return request


def many(request, context):
    for i in range(int(request.decode())):
        yield b"message %d" % i


def fail(request, context):
    yield b"first"
    context.set_trailing_metadata((("x-custom-trailer", "custom-value"),))
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "ran dry")


def deny(request, context):
    context.abort(grpc.StatusCode.PERMISSION_DENIED, "not you")


def main():
    ident = lambda b: b
    handlers = {
        "Echo": grpc.unary_unary_rpc_method_handler(echo, ident, ident),
        "Many": grpc.unary_stream_rpc_method_handler(many, ident, ident),
        "Fail": grpc.unary_stream_rpc_method_handler(fail, ident, ident),
        "Deny": grpc.unary_unary_rpc_method_handler(deny, ident, ident),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Web", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


if __name__ == "__main__":
    main()
