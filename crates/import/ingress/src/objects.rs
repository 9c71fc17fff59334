//! The Kubernetes objects of the input: every document (and every item of a `List`) sorted
//! by kind, with its namespace and name.

use veloxy_import::tree::Node;
use veloxy_import::{Loc, Report};

/// One object: where its `kind` is, its namespace (default `default`) and name.
#[derive(Debug)]
pub struct Object<'a> {
    /// The document.
    pub node: &'a Node,
    /// The `kind:` value's location (the object's report line).
    pub loc: Loc,
    /// `metadata.namespace`, else `default`.
    pub ns: String,
    /// `metadata.name`.
    pub name: String,
}

impl Object<'_> {
    /// `NS/NAME`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.ns, self.name)
    }

    /// `metadata.annotations` entries.
    pub fn annotations(&self) -> &[(veloxy_import::tree::Key, Node)] {
        self.node
            .get("metadata")
            .and_then(|m| m.get("annotations"))
            .and_then(Node::as_map)
            .unwrap_or(&[])
    }

    /// A value under `spec`.
    pub fn spec(&self, key: &str) -> Option<&Node> {
        self.node.get("spec")?.get(key)
    }
}

/// The objects by kind, in input order.
#[derive(Debug, Default)]
pub struct Objects<'a> {
    /// `Ingress` (networking.k8s.io/v1).
    pub ingresses: Vec<Object<'a>>,
    /// `Service`.
    pub services: Vec<Object<'a>>,
    /// `Secret`.
    pub secrets: Vec<Object<'a>>,
    /// `ConfigMap`.
    pub configmaps: Vec<Object<'a>>,
    /// `IngressClass`.
    pub classes: Vec<Object<'a>>,
    /// Positions in `services` and `secrets` by (namespace, name), the first of each: a
    /// thousand Ingresses look their Services up a thousand times.
    services_at: std::collections::HashMap<(String, String), usize>,
    secrets_at: std::collections::HashMap<(String, String), usize>,
}

impl<'a> Objects<'a> {
    /// Sorts `doc` (and the items of a `List`) into kinds; other kinds get an `ignored` line.
    pub fn add(&mut self, doc: &'a Node, report: &mut Report) {
        let Some(kind) = doc.get("kind") else {
            if !doc.is_null() {
                report.ignored(
                    &doc.loc,
                    "document",
                    "no `kind`: not a Kubernetes object ingress-nginx reads",
                );
            }
            return;
        };
        let k = kind.as_str().unwrap_or_default();
        if k == "List" || k.ends_with("List") {
            for item in doc.get("items").and_then(Node::as_seq).unwrap_or(&[]) {
                self.add(item, report);
            }
            return;
        }
        let meta = doc.get("metadata");
        let text = |key: &str| {
            meta.and_then(|m| m.get(key))
                .and_then(Node::scalar)
                .unwrap_or_default()
        };
        let ns = Some(text("namespace"))
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        let obj = Object {
            node: doc,
            loc: kind.loc.clone(),
            ns,
            name: text("name"),
        };
        let api = doc
            .get("apiVersion")
            .and_then(Node::scalar)
            .unwrap_or_default();
        match k {
            "Ingress" if api == "networking.k8s.io/v1" => self.ingresses.push(obj),
            "Ingress" => report.refused(
                &obj.loc,
                format!("Ingress {}", obj.id()),
                format!(
                    "apiVersion {api:?}: only networking.k8s.io/v1 Ingresses are read (convert \
                     older ones with kubectl convert)"
                ),
            ),
            "Service" => {
                let key = (obj.ns.clone(), obj.name.clone());
                self.services_at.entry(key).or_insert(self.services.len());
                self.services.push(obj);
            }
            "Secret" => {
                let key = (obj.ns.clone(), obj.name.clone());
                self.secrets_at.entry(key).or_insert(self.secrets.len());
                self.secrets.push(obj);
            }
            "ConfigMap" => self.configmaps.push(obj),
            "IngressClass" => self.classes.push(obj),
            other => report.ignored(
                &obj.loc,
                format!("{other} {}", obj.id()),
                "not read by ingress-nginx's HTTP routing (only Ingress, Service, Secret, \
                 ConfigMap and IngressClass are)",
            ),
        }
    }

    /// The object of `list` named `ns/name`.
    pub fn find<'s>(list: &'s [Object<'a>], ns: &str, name: &str) -> Option<&'s Object<'a>> {
        list.iter().find(|o| o.ns == ns && o.name == name)
    }

    /// The Service `ns/name` (the first of that name).
    pub fn service(&self, ns: &str, name: &str) -> Option<&Object<'a>> {
        let at = self.services_at.get(&(ns.to_string(), name.to_string()))?;
        self.services.get(*at)
    }

    /// The Secret `ns/name` (the first of that name).
    pub fn secret(&self, ns: &str, name: &str) -> Option<&Object<'a>> {
        let at = self.secrets_at.get(&(ns.to_string(), name.to_string()))?;
        self.secrets.get(*at)
    }
}
