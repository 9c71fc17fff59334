//! `mirror-target` with `mirror-request-body` and `mirror-host`: ingress-nginx's copy of
//! each request to another service (nginx's `mirror`), as the routes' `mirror`.

use toml::Value;

use crate::annotations::{Ann, KeysApi};
use crate::objects::Object;
use crate::Ctx;

/// The annotations that only mean something with `mirror-target`.
const FAMILY: &[&str] = &["mirror-request-body", "mirror-host"];

/// `mirror-target` (`http[s]://HOST[:PORT]$request_uri`): the copies go to a group of that
/// host with the request's own path; the Host of the copy is `mirror-host`, else the
/// target's host (as ingress-nginx sets it); `mirror-request-body: "off"` sends no body.
pub fn mirror(ctx: &mut Ctx, ing: &Object, keys: &mut KeysApi, ann: &mut Ann) {
    let Some((_, target)) = keys.get("mirror-target") else {
        for n in FAMILY {
            keys.ignore(ctx, n, "no mirror-target: ingress-nginx ignores it");
        }
        return;
    };
    let (https, host, port) = match parse_target(&target) {
        Ok(t) => t,
        Err(e) => {
            keys.refuse_family(ctx, "mirror-target", FAMILY, e);
            return;
        }
    };
    let servers = ctx.service_servers_for_host(&host, port, https);
    let base = format!("mirror-{}", host.split('.').next().unwrap_or("shadow"));
    let group = ctx.auth_group(&base, servers, &ing.loc);
    let mut m = toml::Table::new();
    m.insert("upstream".into(), group.into());
    match keys
        .get("mirror-request-body")
        .map(|(_, v)| v.trim().to_owned())
    {
        Some(v) if v == "off" => {
            m.insert("body".into(), false.into());
            keys.ok(ctx, "mirror-request-body");
        }
        Some(v) if v == "on" => keys.ok(ctx, "mirror-request-body"),
        Some(v) => keys.refuse(
            ctx,
            "mirror-request-body",
            format!("{v:?} is not \"on\" or \"off\""),
        ),
        None => {}
    }
    let mirror_host = match keys.get("mirror-host") {
        Some((_, h)) if !h.trim().is_empty() && !h.contains(['$', ' ']) => {
            keys.ok(ctx, "mirror-host");
            h.trim().to_owned()
        }
        Some((_, h)) => {
            keys.refuse(ctx, "mirror-host", format!("{h:?} is not a host name"));
            host.clone()
        }
        None => host.clone(),
    };
    m.insert("host".into(), mirror_host.into());
    ann.rules
        .insert("mirror".into(), Value::Array(vec![Value::Table(m)]));
    keys.diff(
        ctx,
        "mirror-target",
        "the copy carries the path as sent to the backend (after rewrite-target; \
         ingress-nginx's $request_uri is the client's), a body of at most 64 KiB (a larger \
         one is not copied), and goes on a new connection per copy",
    );
}

/// `(https, host, port)` of a target whose path is the request's (`$request_uri`, or
/// nothing after the host: ingress-nginx then sends every copy to `/`, which veloxy cannot).
fn parse_target(url: &str) -> Result<(bool, String, u16), String> {
    let url = url.trim();
    let (https, rest) = crate::util::split_scheme(url)?;
    let end = rest.find(['/', '$', '?']).unwrap_or(rest.len());
    let (hostport, path) = rest.split_at(end);
    if !matches!(path, "$request_uri" | "/$request_uri") {
        return Err(format!(
            "{url:?}: veloxy's mirror sends each copy with the request's own path (write \
             {}$request_uri)",
            &url[..url.len() - path.len()]
        ));
    }
    let (host, port) = crate::util::host_port(url, hostport, https)?;
    if host.is_empty() || host.contains('$') {
        return Err(format!("{url:?}: no fixed host"));
    }
    Ok((https, host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::parse_target;

    #[test]
    fn a_target_keeps_the_request_uri_or_is_refused() {
        assert_eq!(
            parse_target("http://shadow.apps.svc:8080$request_uri"),
            Ok((false, "shadow.apps.svc".into(), 8080))
        );
        assert_eq!(
            parse_target("https://test.env.com/$request_uri"),
            Ok((true, "test.env.com".into(), 443))
        );
        let e = parse_target("http://shadow.apps.svc/").unwrap_err();
        assert!(e.contains("http://shadow.apps.svc$request_uri"), "{e}");
        assert!(parse_target("shadow:80").is_err());
    }
}
