//! veloxy's own answers, decided at admission: redirects (`redirect`, `redirect_https`) and
//! fixed responses (`respond`). Each codec writes them in its protocol. The [`Answer`] value
//! itself is `crate::message`'s; the error pages of a route's rules, and the template
//! variables of a request, are built here.

use bytes::Bytes;

pub(crate) use crate::message::Answer;

use super::{Head, Peer};
use crate::template::{Var, Vars};

impl Answer {
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
