//! A route's `grpc_web`: gRPC-Web clients (browsers) served in front of a gRPC upstream.
//!
//! `grpc_web = true` turns it on with CORS for any origin; `grpc_web = { cors_origins = [...] }`
//! with CORS for those origins only; `false` (or no key) leaves it off. The route must go to
//! an `h2` or `h2c` group: gRPC needs HTTP/2 and its trailers. Unless the route has a `cors`
//! of its own (which then answers as written), `grpc_web` gives it one for gRPC-Web
//! browsers: preflights allowed for the request's Origin (echoed back), method `POST`, the
//! fields gRPC-Web clients send (`x-grpc-web`, `x-user-agent`, `grpc-timeout`,
//! `content-type`, `authorization`), and `grpc-status` and `grpc-message` exposed to the page.

use std::sync::Arc;

use toml::Spanned;

use super::super::error::{ConfigError, Source};
use super::super::file::{GrpcWebSection, RouteSection};
use crate::config::{UpstreamGroup, UpstreamProtocol};
use crate::rules::{GrpcWeb, RouteRules};

/// The fields gRPC-Web clients send, allowed in preflights.
const ALLOW_HEADERS: &[&str] = &[
    "x-grpc-web",
    "x-user-agent",
    "grpc-timeout",
    "content-type",
    "authorization",
];
/// The fields a gRPC-Web page may read.
const EXPOSE_HEADERS: &[&str] = &["grpc-status", "grpc-message"];

/// Adds the route's `grpc_web` (and the CORS it makes) to its rules; `group`: the route's
/// upstream group, if it is proxied.
pub(super) fn grpc_web(
    src: &Source,
    key: &str,
    r: &RouteSection,
    group: Option<&UpstreamGroup>,
    rules: Option<Arc<RouteRules>>,
) -> Result<Option<Arc<RouteRules>>, ConfigError> {
    let Some(g) = &r.grpc_web else {
        return Ok(rules);
    };
    let key = format!("{key}.grpc_web");
    let origins = match g.get_ref() {
        GrpcWebSection::Flag(false) => return Ok(rules),
        GrpcWebSection::Flag(true) => None,
        GrpcWebSection::Table(t) => Some(t.cors_origins.clone().unwrap_or_default()),
    };
    check_group(src, &key, g, group)?;
    let err = |m: String| src.error(g.span(), format!("{key}.cors_origins"), m);
    if let Some(list) = &origins {
        if list.is_empty() {
            return Err(err("must name at least one origin (or \"*\")".into()));
        }
        if let Some(o) = list
            .iter()
            .find(|o| *o != "*" && !(o.starts_with("http://") || o.starts_with("https://")))
        {
            return Err(err(format!(
                "{o:?} is not an origin like \"https://app.example.com\""
            )));
        }
        if r.cors.is_some() {
            return Err(err(
                "the route's cors sets its CORS already: list the origins there".into(),
            ));
        }
    }
    let origins = origins.map(|l| {
        l.iter()
            .map(|o| o.trim_end_matches('/').to_ascii_lowercase())
            .collect::<Vec<_>>()
    });
    let mut rules = rules.map(|r| (*r).clone()).unwrap_or_default();
    let made_cors = rules.cors.is_none();
    if made_cors {
        rules.cors = Some(crate::cors::Cors {
            origins: origins.clone().unwrap_or_else(|| vec!["*".to_owned()]),
            methods: "POST".to_owned(),
            headers: ALLOW_HEADERS.join(", "),
            expose_headers: EXPOSE_HEADERS.join(", "),
            credentials: false,
            max_age: 86400,
            echo_origin: true,
        });
    }
    rules.grpc_web = Some(GrpcWeb {
        cors_origins: origins,
        made_cors,
    });
    Ok(Some(Arc::new(rules)))
}

/// The route goes to an `h2` or `h2c` group.
fn check_group(
    src: &Source,
    key: &str,
    g: &Spanned<GrpcWebSection>,
    group: Option<&UpstreamGroup>,
) -> Result<(), ConfigError> {
    match group {
        None => Err(src.error(
            g.span(),
            key,
            "is for proxied routes to an h2 or h2c upstream group (gRPC needs HTTP/2)",
        )),
        Some(group) if !matches!(group.protocol, UpstreamProtocol::H2 | UpstreamProtocol::H2c) => {
            let protocol = match group.protocol {
                UpstreamProtocol::Fastcgi => "fastcgi",
                _ => "http1",
            };
            Err(src.error(
                g.span(),
                key,
                format!(
                    "upstream {:?} speaks {protocol}: gRPC-Web goes to a gRPC server over \
                     HTTP/2 (set protocol = \"h2c\" or \"h2\" on the group)",
                    group.name
                ),
            ))
        }
        Some(_) => Ok(()),
    }
}
