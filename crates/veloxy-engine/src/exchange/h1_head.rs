//! The HTTP/1.1 request head written for an upstream from a protocol-neutral request
//! ([`Head`]): for HTTP/2 and HTTP/3 clients of HTTP/1 groups and for cache fills, one
//! writer. (An HTTP/1 client's head is rewritten from its own parsed bytes by
//! `http1::request::write_upstream_head`: the fast path, which sees the fields as the
//! client sent them.)
//!
//! The request's end-to-end fields go on as they are, minus what veloxy rewrites or does
//! not forward (hop-by-hop fields, framing, Host, Expect, the X-Forwarded-* fields:
//! `http1::classify`), names with `_` unless `[server] underscores_in_headers`, and what
//! the route's `request_headers` drop; an HTTP/2 request's split Cookie fields are joined
//! into one (RFC 9113 8.2.3); then the framing, the X-Forwarded-* fields, the route's
//! added fields and the hooks'. The caller ends the head (its blank line).

use super::{Head, ProxyTarget};
use crate::http1::BodyKind;

/// How [`write`] writes a head.
pub(crate) struct HeadOptions<'a> {
    /// The request method (a cache fill asks with GET whatever the client sent).
    pub method: &'a str,
    /// The body's framing on the HTTP/1.1 hop.
    pub framing: BodyKind,
    /// Leave out conditional and range fields: a cache fill asks for the whole object.
    pub unconditional: bool,
    /// The Host to send when the request named none (the backend's address).
    pub fallback_host: &'a str,
    /// What the X-Forwarded-* fields say: the client's address and scheme.
    pub client_ip: &'a str,
    pub proto: &'a str,
    /// `[server] underscores_in_headers`.
    pub keep_underscores: bool,
    /// The fields the hooks add (`Name: value\r\n` lines).
    pub hook_lines: Option<&'a [u8]>,
}

fn conditional(lower: &str) -> bool {
    matches!(
        lower,
        "if-none-match"
            | "if-modified-since"
            | "if-match"
            | "if-unmodified-since"
            | "if-range"
            | "range"
    )
}

/// Appends the head of `head` as `t` sends it upstream, without its final blank line.
pub(crate) fn write(head: &Head, t: &ProxyTarget, o: &HeadOptions, out: &mut Vec<u8>) {
    let edit = t.edit.as_ref();
    let dropped = |n: &str| edit.is_some_and(|e| e.drops(n));
    out.extend_from_slice(o.method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(t.path.as_deref().unwrap_or(head.target).as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let host: &[u8] = match head.host.is_empty() {
        true => o.fallback_host.as_bytes(),
        false => head.host,
    };
    if !dropped("host") {
        out.extend_from_slice(b"Host: ");
        out.extend_from_slice(host);
        out.extend_from_slice(b"\r\n");
    }
    let mut cookies = 0;
    for (name, value) in head.fields.iter() {
        let lower = name.to_ascii_lowercase();
        if crate::http1::classify(&lower) != crate::http1::Special::None
            || (!o.keep_underscores && lower.contains('_'))
            || (o.unconditional && conditional(&lower))
            || dropped(&lower)
        {
            continue;
        }
        if lower == "cookie" {
            cookies += 1;
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if cookies > 0 {
        out.extend_from_slice(b"cookie: ");
        for (i, v) in head.fields.cookies().enumerate() {
            if i > 0 {
                out.extend_from_slice(b"; ");
            }
            out.extend_from_slice(v);
        }
        out.extend_from_slice(b"\r\n");
    }
    crate::http1::write_framing(o.framing, out);
    let prior = head
        .fields
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("x-forwarded-for"))
        .map(|(_, v)| v);
    let host_field = (!host.is_empty()).then_some(host);
    crate::http1::write_forwarded(out, prior, o.client_ip, o.proto, host_field, edit);
    if let Some(e) = edit {
        e.added().into_iter().for_each(|l| out.extend_from_slice(l));
    }
    if let Some(lines) = o.hook_lines {
        out.extend_from_slice(lines);
    }
}
