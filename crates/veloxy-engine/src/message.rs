//! A request head and veloxy's own answers as protocol-neutral values: what each downstream
//! codec turns its request into, and what admission, the search gateway and the cache
//! answer with before any upstream is asked. Plain values, below everything that handles
//! them; `exchange` re-exports them.

use bytes::Bytes;

/// A request's header fields, as its protocol delivered them.
#[derive(Clone, Copy)]
pub(crate) enum Fields<'a> {
    H1(&'a [httparse::Header<'a>]),
    H2(&'a http::HeaderMap),
}

impl<'a> Fields<'a> {
    /// The first value of `name` (lowercase).
    pub fn get(&self, name: &str) -> Option<&'a [u8]> {
        match *self {
            Fields::H1(h) => h
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| h.value),
            Fields::H2(h) => h.get(name).map(|v| v.as_bytes()),
        }
    }

    /// The values of every Cookie field.
    pub fn cookies(&self) -> Cookies<'a> {
        match *self {
            Fields::H1(h) => Cookies::H1(h.iter()),
            Fields::H2(h) => Cookies::H2(h.get_all(http::header::COOKIE).iter()),
        }
    }
}

impl<'a> Fields<'a> {
    /// Every field, in order, as (name, value).
    pub fn iter(&self) -> FieldsIter<'a> {
        match *self {
            Fields::H1(h) => FieldsIter::H1(h.iter()),
            Fields::H2(h) => FieldsIter::H2(h.iter()),
        }
    }
}

/// Iterator over a request's fields.
pub(crate) enum FieldsIter<'a> {
    H1(std::slice::Iter<'a, httparse::Header<'a>>),
    H2(http::header::Iter<'a, http::HeaderValue>),
}

impl<'a> Iterator for FieldsIter<'a> {
    type Item = (&'a str, &'a [u8]);
    fn next(&mut self) -> Option<(&'a str, &'a [u8])> {
        match self {
            FieldsIter::H1(it) => it.next().map(|h| (h.name, h.value)),
            FieldsIter::H2(it) => it.next().map(|(n, v)| (n.as_str(), v.as_bytes())),
        }
    }
}

/// Iterator over Cookie field values.
pub(crate) enum Cookies<'a> {
    H1(std::slice::Iter<'a, httparse::Header<'a>>),
    H2(http::header::ValueIter<'a, http::HeaderValue>),
}

impl<'a> Iterator for Cookies<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        match self {
            Cookies::H1(it) => it
                .find(|h| h.name.eq_ignore_ascii_case("cookie"))
                .map(|h| h.value),
            Cookies::H2(it) => it.next().map(|v| v.as_bytes()),
        }
    }
}

/// A protocol-neutral view of a request head: all that admission looks at.
pub(crate) struct Head<'a> {
    pub method: &'a str,
    /// The request target: path and query.
    pub target: &'a str,
    /// Host header or `:authority`, as sent (port included).
    pub host: &'a [u8],
    /// 0: HTTP/1.0, 1: HTTP/1.1, 2: HTTP/2.
    pub version: u8,
    pub fields: Fields<'a>,
}

impl Head<'_> {
    /// The path without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

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
