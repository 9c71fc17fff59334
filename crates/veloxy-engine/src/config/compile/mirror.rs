//! A route's `mirror`: the shadow groups its requests are copied to.

use std::collections::HashMap;
use std::sync::Arc;

use toml::Spanned;

use super::super::error::{ConfigError, Source};
use super::super::file::MirrorSection;
use crate::config::{UpstreamGroup, UpstreamProtocol};
use crate::rules::Mirror;

/// `mirror` (one table or a list): each group must exist and take plain HTTP/1.1 requests
/// (the copy is sent as one), and each `percent` be within 0..=100.
pub(super) fn mirrors(
    src: &Source,
    key: &str,
    v: &Spanned<MirrorSection>,
    upstream_index: &HashMap<String, usize>,
    groups: &[UpstreamGroup],
) -> Result<Arc<[Mirror]>, ConfigError> {
    let mut out = Vec::new();
    for (i, t) in v.get_ref().0.iter().enumerate() {
        let k = match v.get_ref().0.len() {
            1 => format!("{key}.mirror"),
            _ => format!("{key}.mirror[{i}]"),
        };
        let name = t.upstream.get_ref();
        let &upstream = upstream_index.get(name).ok_or_else(|| {
            src.error(
                t.upstream.span(),
                format!("{k}.upstream"),
                format!("upstream {name:?} is not defined (add [upstreams.{name}])"),
            )
        })?;
        let g = &groups[upstream];
        if g.protocol != UpstreamProtocol::Http1 || g.proxy_protocol > 0 {
            return Err(src.error(
                t.upstream.span(),
                format!("{k}.upstream"),
                format!(
                    "upstream {name:?}: a mirror sends plain HTTP/1.1 copies (protocol = \
                     \"http1\", no proxy_protocol)"
                ),
            ));
        }
        let percent = t.percent.as_ref().map_or(100.0, |p| *p.get_ref());
        if !(0.0..=100.0).contains(&percent) {
            let span = t.percent.as_ref().map_or(v.span(), |p| p.span());
            return Err(src.error(
                span,
                format!("{k}.percent"),
                "must be a number from 0 to 100",
            ));
        }
        let host = t.host.as_ref().map(|h| h.get_ref().clone());
        if let (Some(h), Some(s)) = (&host, &t.host) {
            if h.is_empty() || h.bytes().any(|b| b.is_ascii_control() || b == b' ') {
                return Err(src.error(s.span(), format!("{k}.host"), "must be a host name"));
            }
        }
        out.push(Mirror {
            upstream,
            percent,
            body: t.body.unwrap_or(true),
            host,
        });
    }
    if out.is_empty() {
        return Err(src.error(v.span(), format!("{key}.mirror"), "is an empty list"));
    }
    Ok(out.into())
}
