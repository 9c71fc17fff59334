//! veloxy's own answers, decided at admission: redirects (`redirect`, `redirect_https`) and
//! fixed responses (`respond`). Each codec writes them in its protocol.

use bytes::Bytes;

use super::{Head, Peer};
use crate::template::{Var, Vars};

/// A complete answer: status, header fields and body.
pub(crate) struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, Bytes)>,
    pub body: Bytes,
}

impl Answer {
    /// A redirect to `location` (already rendered: no CR, LF or NUL).
    pub fn redirect(status: u16, location: String) -> Answer {
        let body = Bytes::from(format!("{status} {}\n", crate::http1::reason(status)));
        Answer {
            status,
            headers: vec![
                ("location", Bytes::from(location)),
                (
                    "content-type",
                    Bytes::from_static(b"text/plain; charset=utf-8"),
                ),
            ],
            body,
        }
    }

    /// `redirect_https`: a 308 to the same host and URI over HTTPS on `port`.
    pub fn to_https(head: &Head, port: u16) -> Answer {
        let host = crate::http1::host_without_port(head.host);
        let port = if port == 443 {
            String::new()
        } else {
            format!(":{port}")
        };
        let host = String::from_utf8_lossy(host);
        Answer::redirect(308, format!("https://{host}{port}{}", head.target))
    }

    /// An error page from `error_pages`, with `status`.
    pub fn page(status: u16, page: &crate::rules::ErrorPage) -> Answer {
        Answer {
            status,
            headers: vec![(
                "content-type",
                Bytes::from_static(page.content_type.as_bytes()),
            )],
            body: page.body.clone(),
        }
    }

    /// A CORS preflight's answer: 204 with `fields`.
    pub fn preflight(fields: Vec<(&'static str, String)>) -> Answer {
        Answer {
            status: 204,
            headers: fields
                .into_iter()
                .map(|(n, v)| (n, Bytes::from(v)))
                .collect(),
            body: Bytes::new(),
        }
    }

    /// `basic_auth`'s challenge: 401 with `WWW-Authenticate`.
    pub fn unauthorized(realm: &str) -> Answer {
        Answer {
            status: 401,
            headers: vec![
                (
                    "www-authenticate",
                    Bytes::from(format!("Basic realm=\"{realm}\", charset=\"UTF-8\"")),
                ),
                (
                    "content-type",
                    Bytes::from_static(b"text/plain; charset=utf-8"),
                ),
            ],
            body: Bytes::from_static(b"401 Unauthorized\n"),
        }
    }

    /// `respond = { ... }`.
    pub fn fixed(status: u16, body: &Bytes, content_type: &str) -> Answer {
        Answer {
            status,
            headers: vec![(
                "content-type",
                Bytes::copy_from_slice(content_type.as_bytes()),
            )],
            body: body.clone(),
        }
    }
}

impl Answer {
    /// The answer as a static response, the form every codec already writes for file
    /// routes: with its Content-Length, and no body for a HEAD request.
    pub fn into_response(self, is_head: bool) -> crate::static_files::Response {
        let mut headers = self.headers;
        // 204 and 304 carry no content, and no Content-Length either.
        if !matches!(self.status, 204 | 304) {
            headers.push(("content-length", Bytes::from(self.body.len().to_string())));
        }
        let body = if is_head || self.body.is_empty() {
            crate::static_files::Body::Empty
        } else {
            crate::static_files::Body::Bytes(self.body)
        };
        crate::static_files::Response {
            status: self.status,
            headers,
            body,
            raw: Default::default(),
        }
    }
}

/// A request's template variables.
pub(crate) struct RequestVars<'a, 'h> {
    pub head: &'a Head<'h>,
    pub peer: &'a Peer<'a>,
    /// The route's `path_regex` captures.
    pub captures: Option<crate::rules::Captures<'a>>,
    /// The request ID ("" when `[server] request_id` is off).
    pub request_id: &'a str,
    /// The client's address (the real one behind trusted proxies).
    pub client_ip: &'a str,
}

impl Vars for RequestVars<'_, '_> {
    fn value(&self, var: &Var, out: &mut String) {
        let lossy = |b: &[u8], out: &mut String| match std::str::from_utf8(b) {
            Ok(s) => out.push_str(s),
            Err(_) => out.push_str(&String::from_utf8_lossy(b)),
        };
        let query = || crate::rules::Request::query(self.head);
        match var {
            Var::Method => out.push_str(self.head.method),
            Var::Host => {
                let at = out.len();
                lossy(crate::http1::host_without_port(self.head.host), out);
                out[at..].make_ascii_lowercase();
            }
            Var::Authority => lossy(self.head.host, out),
            Var::Uri => out.push_str(self.head.target),
            Var::Path => out.push_str(self.head.path()),
            Var::Query => out.push_str(query()),
            Var::IsArgs => out.push_str(if query().is_empty() { "" } else { "?" }),
            Var::Scheme => out.push_str(if self.peer.tls { "https" } else { "http" }),
            Var::ClientIp => out.push_str(self.client_ip),
            Var::ClientPort => out.push_str(&self.peer.addr.port().to_string()),
            Var::ServerPort => out.push_str(&self.peer.server_port.to_string()),
            Var::Header(name) => lossy(self.head.fields.get(name).unwrap_or(b""), out),
            Var::Cookie(name) => {
                let value = crate::http1::cookie_value(self.head.fields.cookies(), name);
                lossy(value.unwrap_or(b""), out);
            }
            Var::QueryArg(name) => {
                out.push_str(crate::rules::query_arg(query(), name).unwrap_or(""));
            }
            Var::Re(cap) => {
                // Names were resolved to indexes at load.
                let m = self.captures.and_then(|c| match cap {
                    crate::template::Capture::Index(i) => c.get(*i),
                    crate::template::Capture::Name(_) => None,
                });
                lossy(m.unwrap_or(b""), out);
            }
            Var::RequestId => out.push_str(self.request_id),
        }
    }
}
