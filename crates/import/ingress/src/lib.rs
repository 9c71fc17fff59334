//! `veloxy import --from ingress`: Kubernetes Ingress objects as ingress-nginx serves them.
//!
//! The input is multi-document YAML (also `List`s): Ingresses (networking.k8s.io/v1),
//! Services (named ports, ExternalName), Secrets (TLS pairs and basic-auth users, written
//! beside the output, 0600), the controller's ConfigMap (global settings) and IngressClasses.
//! What is translated is ingress-nginx's behaviour, not the objects' spelling: its path
//! matching (Prefix as `/p/` plus `= /p`, regex hosts as case-insensitive `^PATH`, longest
//! first), its default upstream fields (X-Real-IP, X-Forwarded-For replaced, X-Scheme...),
//! the 1m body limit and 5s/60s/60s timeouts, the 308 redirect of hosts with a certificate
//! and HSTS, and each annotation of `nginx.ingress.kubernetes.io/`.
//!
//! Classes: an Ingress whose class (ingressClassName or the legacy annotation) belongs to
//! another controller — an IngressClass of the input names a controller other than
//! `k8s.io/ingress-nginx`, or the name is a well-known other controller's — is ignored and
//! said so; every other Ingress is imported, its class in a comment above its routes.
//!
//! Layout: [`objects`] sorts the documents, [`global`] reads the ConfigMap, [`annotations`]
//! and [`auth`] read each Ingress's annotations, [`tls`] the certificates, [`routes`] makes
//! the routes, [`groups`] the upstream groups.

pub mod annotations;
pub mod auth;
mod families;
pub mod global;
pub mod groups;
mod locations;
mod mirror;
pub mod objects;
pub mod route;
pub mod routes;
pub mod tls;
pub mod util;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use veloxy_import::tree::{self, Node};
use veloxy_import::{Config, ImportError, Imported, Importer, Loc, Options, Report};

use annotations::Ann;
use global::Global;
use objects::{Object, Objects};

/// The ingress importer.
pub struct Ingress;

impl Importer for Ingress {
    fn name(&self) -> &'static str {
        "ingress"
    }

    fn detect(&self, _path: &Path, text: &str) -> bool {
        text.contains("apiVersion")
            && text.lines().any(|l| {
                let l = l.trim().trim_start_matches("- ").trim();
                l == "kind: Ingress" || l == "kind: \"Ingress\"" || l == "kind: 'Ingress'"
            })
    }

    fn import(&self, files: &[PathBuf], opts: &Options) -> Result<Imported, ImportError> {
        if files.is_empty() {
            return Err(ImportError::Usage("ingress import: no input file".into()));
        }
        let mut docs = Vec::new();
        for f in files {
            let text = veloxy_import::source::read(f)?;
            let name: Arc<str> = f.display().to_string().into();
            docs.extend(tree::parse_yaml(&name, &text)?);
        }
        import_docs(&docs, opts)
    }
}

/// Translates parsed documents (Ingresses, Services, Secrets, ConfigMaps, IngressClasses; from
/// files or, in the Kubernetes provider, from objects read off the API server as JSON).
pub fn import_docs(docs: &[Node], opts: &Options) -> Result<Imported, ImportError> {
    import_docs_with_sources(docs, opts).map(|(imported, _)| imported)
}

/// [`import_docs`], with where each group's servers come from in `opts.services`.
pub fn import_docs_with_sources(
    docs: &[Node],
    opts: &Options,
) -> Result<(Imported, groups::Sources), ImportError> {
    let mut report = Report::default();
    let mut objs = Objects::default();
    for d in docs {
        objs.add(d, &mut report);
    }
    if objs.ingresses.is_empty() {
        return Err(ImportError::Usage(
            "ingress import: no networking.k8s.io/v1 Ingress in the input".into(),
        ));
    }
    let mut ctx = Ctx {
        objs: &objs,
        g: Global::default(),
        opts,
        config: Config::default(),
        report,
        used_secrets: Vec::new(),
        used_services: Default::default(),
        groups: Vec::new(),
        sources: Default::default(),
    };
    run(&mut ctx);
    let Ctx {
        config,
        mut report,
        sources,
        ..
    } = ctx;
    report.sort();
    Ok((Imported { config, report }, sources))
}

/// Everything the translation shares.
pub struct Ctx<'a> {
    /// The input's objects.
    pub objs: &'a Objects<'a>,
    /// The controller's settings.
    pub g: Global,
    /// The command line.
    pub opts: &'a Options,
    /// The output.
    pub config: Config,
    /// The report.
    pub report: Report,
    /// Secrets written to files (ns, name, where).
    pub used_secrets: Vec<(String, String, Loc)>,
    /// Services an Ingress sends to (ns, name).
    pub used_services: std::collections::HashSet<(String, String)>,
    /// Upstream groups made so far: their settings and names.
    pub groups: Vec<(groups::GroupKey, String)>,
    /// Where the groups' servers come from in `opts.services`.
    pub sources: groups::Sources,
}

/// One Ingress with its annotations and whether it is imported.
pub struct IngInfo<'o> {
    /// The object.
    pub obj: &'o Object<'o>,
    /// Its annotations.
    pub ann: Ann,
    /// The class, for the comment above its routes.
    pub class: Option<String>,
    /// False for another controller's Ingress.
    pub imported: bool,
}

/// Names of other controllers' classes (ingressClassName or the legacy annotation).
const OTHER_CLASSES: &[&str] = &[
    "traefik",
    "haproxy",
    "kong",
    "istio",
    "alb",
    "gce",
    "gce-internal",
    "contour",
    "cilium",
    "azure-application-gateway",
    "azure/application-gateway",
    "nginx-plus",
    "ambassador",
    "skipper",
    "voyager",
    "apisix",
    "openshift-default",
];

fn run(ctx: &mut Ctx) {
    let objs = ctx.objs;
    for cm in &objs.configmaps {
        if global::is_controller_configmap(cm) {
            let mut g = std::mem::take(&mut ctx.g);
            global::read(cm, &mut g, &mut ctx.report);
            ctx.g = g;
        } else {
            ctx.report.ignored(
                &cm.loc,
                format!("ConfigMap {}", cm.id()),
                "not the controller's ConfigMap (its name names neither ingress nor nginx)",
            );
        }
    }
    let mut ings = Vec::new();
    for obj in &objs.ingresses {
        let legacy = obj
            .annotations()
            .iter()
            .find(|(k, _)| k.name == "kubernetes.io/ingress.class")
            .map(|(k, v)| (k.loc.clone(), v.scalar().unwrap_or_default()));
        let probe = Ann {
            legacy_class: legacy,
            ..Ann::default()
        };
        let (class, imported) = class_of(ctx, obj, &probe);
        let ann = if imported {
            annotations::read(ctx, obj)
        } else {
            for (k, _) in obj.annotations() {
                if k.name != "kubernetes.io/ingress.class" {
                    ctx.report
                        .ignored(&k.loc, &k.name, "the Ingress is not imported");
                }
            }
            for p in obj.node.get("spec").and_then(Node::as_map).unwrap_or(&[]) {
                if p.0.name != "ingressClassName" {
                    ctx.report.ignored(
                        &p.0.loc,
                        format!("spec.{}", p.0.name),
                        "the Ingress is not imported",
                    );
                }
            }
            probe
        };
        ings.push(IngInfo {
            obj,
            ann,
            class,
            imported,
        });
    }
    if let Some(first) = ings.iter().find(|i| i.imported) {
        implicit(ctx, first.obj);
    }
    server_section(ctx);
    let certs = tls::read(ctx, &ings);
    routes::build(ctx, &ings, &certs);
    for c in &objs.classes {
        ctx.report
            .translated(&c.loc, format!("IngressClass {}", c.name));
    }
    for s in &objs.secrets {
        if !ctx
            .used_secrets
            .iter()
            .any(|(ns, n, _)| *ns == s.ns && *n == s.name)
        {
            ctx.report.ignored(
                &s.loc,
                format!("Secret {}", s.id()),
                "no imported Ingress uses it",
            );
        } else {
            ctx.report.translated(&s.loc, format!("Secret {}", s.id()));
        }
    }
    for s in &objs.services {
        if ctx.used_services.contains(&(s.ns.clone(), s.name.clone())) {
            ctx.report.translated(&s.loc, format!("Service {}", s.id()));
        } else {
            ctx.report.ignored(
                &s.loc,
                format!("Service {}", s.id()),
                "no imported Ingress sends to it",
            );
        }
    }
}

/// The class of an Ingress and whether ingress-nginx serves it.
fn class_of(ctx: &mut Ctx, obj: &Object, ann: &Ann) -> (Option<String>, bool) {
    let spec_class = obj.spec("ingressClassName");
    let (name, loc) = match (spec_class, &ann.legacy_class) {
        (Some(n), _) => (n.scalar().unwrap_or_default(), n.loc.clone()),
        (None, Some((l, v))) => (v.clone(), l.clone()),
        (None, None) => {
            ctx.report
                .translated(&obj.loc, format!("Ingress {}", obj.id()));
            return (None, true);
        }
    };
    let controller = ctx
        .objs
        .classes
        .iter()
        .find(|c| c.name == name)
        .and_then(|c| c.spec("controller").and_then(Node::scalar));
    let other = match &controller {
        Some(c) => c != "k8s.io/ingress-nginx",
        None => OTHER_CLASSES.contains(&name.as_str()),
    };
    let directive = if spec_class.is_some() {
        "spec.ingressClassName".to_string()
    } else {
        "kubernetes.io/ingress.class".to_string()
    };
    if other {
        let why = format!(
            "class {name:?} belongs to another controller{}: ingress-nginx does not serve \
             this Ingress",
            controller.map(|c| format!(" ({c})")).unwrap_or_default()
        );
        ctx.report
            .ignored(&obj.loc, format!("Ingress {}", obj.id()), why.clone());
        ctx.report.ignored(&loc, directive, why);
        if spec_class.is_some() {
            if let Some((l, _)) = &ann.legacy_class {
                ctx.report.ignored(
                    l,
                    "kubernetes.io/ingress.class",
                    "the Ingress is not imported",
                );
            }
        }
        return (Some(name), false);
    }
    ctx.report
        .translated(&obj.loc, format!("Ingress {}", obj.id()));
    ctx.report.translated(&loc, directive);
    if spec_class.is_some() {
        if let Some((l, _)) = &ann.legacy_class {
            ctx.report.ignored(
                l,
                "kubernetes.io/ingress.class",
                "spec.ingressClassName takes precedence",
            );
        }
    }
    (Some(name), true)
}

/// `[server]`: the request ID ingress-nginx forwards, client addresses from trusted proxies,
/// and the ConfigMap's timeouts.
fn server_section(ctx: &mut Ctx) {
    let first = ctx.objs.ingresses[0].loc.clone();
    let s = &mut ctx.config.server;
    s.add_from(&first);
    s.set("request_id", "X-Request-ID");
    if ctx.g.use_forwarded_headers || ctx.g.enable_real_ip {
        let mut cidrs = ctx.g.real_ip_cidr.clone();
        if cidrs == ["0.0.0.0/0"] {
            cidrs.push("::/0".into());
        }
        s.set("trusted_proxies", util::strings(&cidrs));
        if ctx.g.forwarded_for_header != "X-Forwarded-For" {
            s.set("client_ip_header", ctx.g.forwarded_for_header.as_str());
        }
    }
    if ctx.g.underscores {
        s.set("underscores_in_headers", true);
    }
    for (k, v) in ctx.g.server.clone() {
        ctx.config.server.set(k, v);
    }
}

/// The first imported Ingress's line carries what differs in ingress-nginx's implicit
/// behaviour, once for the whole import.
fn implicit(ctx: &mut Ctx, obj: &Object) {
    let directive = format!("Ingress {}", obj.id());
    let mut notes = vec![
        "ingress-nginx's implicit behaviour is kept (its upstream fields in \
         [rule_sets.ingress-nginx], the 1m body limit, 5s/60s/60s timeouts, no retry on a \
         backend's 5xx, the HTTPS redirect and HSTS of hosts with a certificate); what \
         differs: veloxy also returns X-Request-ID to the client; an idle WebSocket closes \
         after the listener's upgrade_idle_timeout (10m) where ingress-nginx uses \
         proxy-read-timeout; veloxy ejects a backend after 5 failures in a row (outlier \
         detection), ingress-nginx's balancer does not"
            .to_string(),
    ];
    let mapped = ctx.opts.services.len();
    if mapped == 0 {
        notes.push(
            "Services are reached by their DNS name (NAME.NAMESPACE.svc, one ClusterIP: \
             kube-proxy picks the pod), where ingress-nginx balances over the pods itself; \
             map them to their pods with --service for the same balancing"
                .into(),
        );
    }
    if let Some(e) = ctx
        .report
        .entries
        .iter_mut()
        .find(|e| e.loc == obj.loc && e.directive == directive)
    {
        e.outcome = veloxy_import::Outcome::Different(notes.join("; "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_document_is_a_parse_error_with_its_place() {
        let dir = std::env::temp_dir().join(format!("veloxy-ingress-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("bad.yaml");
        std::fs::write(
            &f,
            "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: [a\n",
        )
        .unwrap();
        match Ingress.import(std::slice::from_ref(&f), &Options::default()) {
            Err(ImportError::Parse(e)) => {
                assert!(e.loc.file.ends_with("bad.yaml"), "{e}");
                assert!(e.loc.line >= 4, "{e}");
            }
            other => panic!("expected a parse error, got {other:?}"),
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn detects_ingress_documents_only() {
        let p = Path::new("x.yaml");
        assert!(Ingress.detect(p, "apiVersion: networking.k8s.io/v1\nkind: Ingress\n"));
        assert!(Ingress.detect(p, "items:\n- apiVersion: v1\n  kind: Ingress\n"));
        assert!(!Ingress.detect(p, "apiVersion: v1\nkind: Service\n"));
        assert!(!Ingress.detect(p, "http:\n  routers: {}\n"));
    }
}
