//! gRPC through veloxy: a tonic client on an h2c listener, an `h2c` upstream group, and a tonic
//! server. Unary and server-streaming calls work end to end, and a gRPC error sent in trailers
//! after streamed messages reaches the client intact.
//!
//! The service is written by hand (what `tonic-build` would generate) so the tests need no
//! `protoc`.

use veloxy_testkit::*;

use std::net::SocketAddr;
use std::pin::Pin;

use tonic::codegen::{http, BoxFuture, Context, Poll, Service, StdError};
use tonic::{Request, Response, Status};

#[derive(Clone, PartialEq, prost::Message)]
pub struct HelloRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint32, tag = "2")]
    pub count: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HelloReply {
    #[prost(string, tag = "1")]
    pub message: String,
}

type ReplyStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<HelloReply, Status>> + Send + 'static>>;

#[derive(Clone)]
struct Greeter;

struct SayHello;
impl tonic::server::UnaryService<HelloRequest> for SayHello {
    type Response = HelloReply;
    type Future = BoxFuture<Response<HelloReply>, Status>;
    fn call(&mut self, req: Request<HelloRequest>) -> Self::Future {
        Box::pin(async move {
            let forwarded = req
                .metadata()
                .get("x-forwarded-for")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let name = req.into_inner().name;
            if name == "nobody" {
                return Err(Status::not_found("no such person"));
            }
            Ok(Response::new(HelloReply {
                message: format!("hello {name} via {forwarded}"),
            }))
        })
    }
}

struct SayMany;
impl tonic::server::ServerStreamingService<HelloRequest> for SayMany {
    type Response = HelloReply;
    type ResponseStream = ReplyStream;
    type Future = BoxFuture<Response<ReplyStream>, Status>;
    fn call(&mut self, req: Request<HelloRequest>) -> Self::Future {
        Box::pin(async move {
            let r = req.into_inner();
            let mut items: Vec<Result<HelloReply, Status>> = (0..r.count)
                .map(|i| {
                    Ok(HelloReply {
                        message: format!("{} #{i}", r.name),
                    })
                })
                .collect();
            if r.name == "then-fail" {
                items.push(Err(Status::resource_exhausted("stream ran dry")));
            }
            let stream: ReplyStream = Box::pin(tokio_stream::iter(items));
            Ok(Response::new(stream))
        })
    }
}

impl<B> Service<http::Request<B>> for Greeter
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match req.uri().path() {
            "/hello.Greeter/SayHello" => Box::pin(async move {
                let codec = tonic_prost::ProstCodec::default();
                Ok(tonic::server::Grpc::new(codec).unary(SayHello, req).await)
            }),
            "/hello.Greeter/SayMany" => Box::pin(async move {
                let codec = tonic_prost::ProstCodec::default();
                Ok(tonic::server::Grpc::new(codec)
                    .server_streaming(SayMany, req)
                    .await)
            }),
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

impl tonic::server::NamedService for Greeter {
    const NAME: &'static str = "hello.Greeter";
}

/// Starts the tonic server on its own thread; returns its address.
fn grpc_server() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        runtime().block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            tonic::transport::Server::builder()
                .add_service(Greeter)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l))
                .await
                .unwrap();
        });
    });
    addr
}

type Client = tonic::client::Grpc<tonic::transport::Channel>;

async fn client(addr: SocketAddr) -> Client {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Client::new(channel)
}

async fn say_hello(c: &mut Client, name: &str) -> Result<HelloReply, Status> {
    c.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static("/hello.Greeter/SayHello");
    let codec = tonic_prost::ProstCodec::<HelloRequest, HelloReply>::default();
    let req = HelloRequest {
        name: name.into(),
        count: 0,
    };
    c.unary(Request::new(req), path, codec)
        .await
        .map(|r| r.into_inner())
}

async fn say_many(c: &mut Client, name: &str, count: u32) -> (Vec<String>, Option<Status>) {
    c.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static("/hello.Greeter/SayMany");
    let codec = tonic_prost::ProstCodec::<HelloRequest, HelloReply>::default();
    let req = HelloRequest {
        name: name.into(),
        count,
    };
    let mut stream = c
        .server_streaming(Request::new(req), path, codec)
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    loop {
        match stream.message().await {
            Ok(Some(m)) => got.push(m.message),
            Ok(None) => return (got, None),
            Err(s) => return (got, Some(s)),
        }
    }
}

fn grpc_config(server: SocketAddr) -> String {
    format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp2 = true\n\
         [[routes]]\nupstream = \"greeter\"\n\
         [upstreams.greeter]\nservers = [\"{server}\"]\nprotocol = \"h2c\"\n"
    )
}

#[test]
fn grpc_unary_and_streaming_through_veloxy() {
    let server = grpc_server();
    let v = veloxy(&grpc_config(server));
    runtime().block_on(async {
        let mut c = client(v.addr).await;
        let r = say_hello(&mut c, "ada").await.unwrap();
        assert_eq!(
            r.message, "hello ada via 127.0.0.1",
            "X-Forwarded-For added"
        );

        let (items, err) = say_many(&mut c, "bob", 50).await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(items.len(), 50);
        assert_eq!(items[49], "bob #49");

        // Many calls multiplexed at once over the one upstream connection.
        let mut tasks = Vec::new();
        for i in 0..40 {
            let mut c = c.clone();
            tasks.push(tokio::spawn(async move {
                say_hello(&mut c, &format!("n{i}")).await.unwrap().message
            }));
        }
        for (i, t) in tasks.into_iter().enumerate() {
            assert!(t.await.unwrap().starts_with(&format!("hello n{i} ")));
        }
    });
}

#[test]
fn grpc_errors_pass_through_in_trailers() {
    let server = grpc_server();
    let v = veloxy(&grpc_config(server));
    runtime().block_on(async {
        let mut c = client(v.addr).await;
        let err = say_hello(&mut c, "nobody").await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
        assert_eq!(err.message(), "no such person");
        // Trailers after streamed messages.
        let (items, err) = say_many(&mut c, "then-fail", 3).await;
        assert_eq!(items.len(), 3);
        let err = err.expect("the error status from the trailers");
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert_eq!(err.message(), "stream ran dry");
    });
}

#[test]
fn grpc_backend_down_is_unavailable() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let v = veloxy(&grpc_config(dead));
    runtime().block_on(async {
        let mut c = client(v.addr).await;
        let err = say_hello(&mut c, "ada").await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    });
}

#[test]
fn http1_clients_reach_h2c_groups_with_trailers() {
    use std::io::{Read, Write};
    let server = grpc_server();
    let v = veloxy(&grpc_config(server));
    // A gRPC call spelled in HTTP/1.1: veloxy carries it over HTTP/2 and brings the trailers
    // back in the chunked trailer section.
    let msg = [0x0a, 0x03, b'a', b'd', b'a'];
    let mut body = vec![0u8, 0, 0, 0, msg.len() as u8];
    body.extend_from_slice(&msg);
    let mut s = std::net::TcpStream::connect(v.addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let head = format!(
        "POST /hello.Greeter/SayHello HTTP/1.1\r\nHost: grpc.test\r\ncontent-type: application/grpc\r\nte: trailers\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&body).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("transfer-encoding: chunked"), "{text}");
    assert!(text.contains("hello ada via 127.0.0.1"), "{text}");
    assert!(
        text.contains("grpc-status: 0"),
        "trailers forwarded: {text}"
    );

    // A body over the group's retry_body_limit is refused with 413, not streamed.
    let big = vec![0u8; 70_000];
    let mut s = std::net::TcpStream::connect(v.addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let head = format!(
        "POST /hello.Greeter/SayHello HTTP/1.1\r\nHost: grpc.test\r\ncontent-type: application/grpc\r\nContent-Length: {}\r\n\r\n",
        big.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(&big);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 413"));
}

#[test]
fn http3_clients_reach_h2c_groups_with_trailers() {
    let server = grpc_server();
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path());
    let (cert, key) = pki.leaf("localhost", &["localhost"], KeyKind::Ecdsa);
    let v = veloxy(&format!(
        "[server]\nworkers = 1\n[listeners.web]\naddr = \"127.0.0.1:0\"\nhttp3 = true\n\
         [listeners.web.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[routes]]\nupstream = \"greeter\"\n\
         [upstreams.greeter]\nservers = [\"{server}\"]\nprotocol = \"h2c\"\n",
        cert.display(),
        key.display()
    ));
    let msg = [0x0a, 0x03, b'a', b'd', b'a'];
    let mut body = vec![0u8, 0, 0, 0, msg.len() as u8];
    body.extend_from_slice(&msg);
    let r = runtime().block_on(async {
        let mut c = h3_connect(v.addr, "localhost", &pki.ca_pem).await.unwrap();
        let req = http::Request::post("https://localhost/hello.Greeter/SayHello")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        h3_send(&mut c, req, Some(body.into())).await.unwrap()
    });
    assert_eq!(r.status, 200);
    assert!(
        String::from_utf8_lossy(&r.body).contains("hello ada"),
        "{:?}",
        r.body
    );
    let trailers = r.trailers.expect("trailers over HTTP/3");
    assert_eq!(
        trailers.get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"0"[..])
    );
}
