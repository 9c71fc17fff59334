//! `[server.tracing]` and a route's `tracing` key.

use super::super::error::{ConfigError, Source};
use super::super::file::{RouteSection, RouteTracingSection, ServerSection};
use crate::otel::TracingSettings;
use crate::rules::RouteTracing;

/// The propagation formats built.
const FORMATS: &[&str] = &["tracecontext", "b3"];

/// `[server.tracing]`: the collector's endpoint, sampling and resource.
pub(super) fn compile_tracing(
    src: &Source,
    s: &ServerSection,
) -> Result<Option<TracingSettings>, ConfigError> {
    let Some(section) = &s.tracing else {
        return Ok(None);
    };
    let t = section.get_ref();
    let key = |k: &str| format!("server.tracing.{k}");
    let endpoint = t.otlp_endpoint.get_ref().trim_end_matches('/');
    // TLS to the collector is not built (the exporter's HTTP client is plain hyper): a local
    // agent or collector is the usual hop.
    let rest = ["http://", "grpc://"]
        .iter()
        .find_map(|p| endpoint.strip_prefix(p));
    if rest.is_none_or(|r| r.is_empty() || r.contains(char::is_whitespace)) {
        return Err(src.error(
            t.otlp_endpoint.span(),
            key("otlp_endpoint"),
            "use http://host:port (OTLP/HTTP, as 4318) or grpc://host:port (OTLP/gRPC, as 4317)",
        ));
    }
    let service_name = match &t.service_name {
        Some(n) if n.get_ref().is_empty() => {
            return Err(src.error(n.span(), key("service_name"), "must not be empty"))
        }
        Some(n) => n.get_ref().clone(),
        None => "veloxy".to_owned(),
    };
    let sample_ratio = match &t.sample_ratio {
        Some(r) => ratio(src, r.span(), &key("sample_ratio"), *r.get_ref())?,
        None => 0.01,
    };
    let propagate = match &t.propagate {
        None => vec!["tracecontext".to_owned()],
        Some(list) => {
            if let Some(bad) = list
                .get_ref()
                .iter()
                .find(|f| !FORMATS.contains(&f.as_str()))
            {
                return Err(src.error(
                    list.span(),
                    key("propagate"),
                    format!(
                        "{bad:?} is not a propagation format veloxy has (\"tracecontext\", \"b3\")"
                    ),
                ));
            }
            list.get_ref().clone()
        }
    };
    Ok(Some(TracingSettings {
        otlp_endpoint: endpoint.to_owned(),
        service_name,
        sample_ratio,
        parent_based: t.parent_based.unwrap_or(true),
        trust_incoming: t.trust_incoming.unwrap_or(true),
        propagate,
        resource: t
            .resource
            .as_ref()
            .map(|r| r.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default(),
    }))
}

fn ratio(
    src: &Source,
    span: std::ops::Range<usize>,
    key: &str,
    r: f64,
) -> Result<f64, ConfigError> {
    match (0.0..=1.0).contains(&r) {
        true => Ok(r),
        false => Err(src.error(span, key, "must be between 0.0 and 1.0")),
    }
}

/// A route's `tracing`: `false` (no spans), `true` (the server's), `{ sample_ratio = R }`.
pub(super) fn route_tracing(
    src: &Source,
    key: &str,
    r: &RouteSection,
) -> Result<Option<RouteTracing>, ConfigError> {
    let Some(t) = &r.tracing else {
        return Ok(None);
    };
    let key = format!("{key}.tracing");
    Ok(match t.get_ref() {
        RouteTracingSection::Flag(true) => None,
        RouteTracingSection::Flag(false) => Some(RouteTracing::Off),
        RouteTracingSection::Table(table) => match table.sample_ratio {
            None => None,
            Some(x) => Some(RouteTracing::Ratio(ratio(
                src,
                t.span(),
                &format!("{key}.sample_ratio"),
                x,
            )?)),
        },
    })
}

/// A route's `tracing` needs `[server.tracing]`.
pub(super) fn check_routes(
    src: &Source,
    (routes, origin): (&[Box<toml::Spanned<RouteSection>>], &[usize]),
    server: Option<&TracingSettings>,
) -> Result<(), ConfigError> {
    if server.is_some() {
        return Ok(());
    }
    for (route, i) in routes.iter().zip(origin) {
        if let Some(t) = &route.get_ref().tracing {
            return Err(src.error(
                t.span(),
                format!("routes[{i}].tracing"),
                "needs [server.tracing] (the collector to send spans to)",
            ));
        }
    }
    Ok(())
}
