//! From the watched objects to a running config: select the Ingresses, translate them with
//! the ingress importer (ingress-nginx's annotation semantics), merge the result into the
//! config file, compile it and swap it in. An Ingress that breaks the compiled config is
//! found by compiling each one alone with the file, left out, and logged; a config that
//! still does not compile is refused and the running one stays.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash as _, Hasher as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::Ingress;
use veloxy_engine::config::compile::compile_str_after;
use veloxy_engine::config::{KubernetesSpec, Snapshot};
use veloxy_engine::upstream::balancer::PolicyRegistry;
use veloxy_engine::Running;
use veloxy_import::{Options, Outcome};

use super::endpoints_only::{Origins, Plan};
use super::events::Problem;
use super::gateway;
use super::in_place::{self, Servers};
use super::merge::{merge, render};
use super::objects::{self, id, World};

/// Why a config was not applied.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("translating the Ingresses: {0}")]
    Translate(#[source] veloxy_import::ImportError),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{source} (in the config merged with the Ingress objects, written to {})", merged.display())]
    Compile {
        merged: PathBuf,
        #[source]
        source: veloxy_engine::ConfigError,
    },
    #[error("swapping in the new config: {0}")]
    Reload(#[source] veloxy_engine::ServerError),
}

/// What the provider keeps between builds.
pub struct Builder<'a> {
    pub spec: KubernetesSpec,
    /// The config file (compiled configs name it in errors and resolve its relative paths).
    pub config_path: &'a Path,
    /// The config file as a TOML table, as last read.
    pub file: toml::Table,
    pub policies: PolicyRegistry,
    /// The private directory (0700) the Secrets' certificates and keys are written to.
    pub dir: PathBuf,
    pub running: &'a Running,
    /// A fingerprint of the last config applied (its text and the files it reads).
    applied: Option<u64>,
    /// The fingerprint of its structure (all but the groups' servers), and the servers it
    /// runs with: a build that differs only in servers is applied in place.
    structure: Option<u64>,
    running_servers: std::collections::BTreeMap<String, in_place::Plain>,
    /// The importer's documents of unchanged objects, kept from the last translation.
    docs: std::cell::RefCell<objects::DocCache>,
    /// What the translation refused, as logged (each line once while it holds).
    reported: std::collections::BTreeSet<String>,
    /// Ingresses left out because they broke the config: `NS/NAME` and resourceVersion.
    left_out: std::collections::BTreeMap<String, String>,
    /// The Gateway API objects of the config applied last, for their status.
    pub gateway: gateway::Report,
    /// What was skipped or refused in the config applied last, by object (for Events).
    pub problems: Vec<Problem>,
    /// Why each Ingress of `left_out` was left out.
    left_out_why: std::collections::BTreeMap<String, String>,
    /// Gateway API routes left out because they broke the config: the route's TOML text
    /// and why (each is tried again only when its translation changes).
    gateway_bad: std::collections::BTreeMap<String, String>,
    /// What the last full build leaves for endpoint-only changes.
    plan: Option<Plan>,
    /// Whether the last full rebuild wrote status (the provider's loop sets it): a replica
    /// that becomes the writer takes a full rebuild.
    pub wrote_status: Option<bool>,
}

/// Which Gateway API routes a merge takes.
#[derive(Clone, Copy)]
enum Gw<'k> {
    /// None of them.
    Off,
    /// All but those of `gateway_bad`.
    On,
    /// Only this one (its groups and certificates too): to find the ones that break it.
    Only(&'k str),
}

/// One translation: the merged config (its groups' servers apart), the fingerprints of it
/// and its files.
struct Merged {
    /// The merged config without the groups' `servers`.
    table: toml::Table,
    servers: Servers,
    /// Of the structure (the table as it is, and the files).
    structure: u64,
    /// Of everything.
    fingerprint: u64,
    /// Set by [`Builder::compile`] when only servers changed: the new sets.
    in_place: Option<in_place::Sets>,
    /// Where the groups' servers come from.
    origins: Origins,
    notes: Vec<String>,
    problems: Vec<Problem>,
    gateway: gateway::Report,
    /// The TOML text of every Gateway API route translated (left out or not).
    gateway_routes: Vec<String>,
}

impl<'a> Builder<'a> {
    /// A builder for `file`, the config at `config_path`.
    pub fn new(
        spec: KubernetesSpec,
        config_path: &'a Path,
        file: toml::Table,
        dir: PathBuf,
        running: &'a Running,
    ) -> Self {
        Builder {
            spec,
            config_path,
            file,
            policies: PolicyRegistry::with_builtins(),
            dir,
            running,
            applied: None,
            structure: None,
            running_servers: Default::default(),
            docs: Default::default(),
            reported: Default::default(),
            left_out: Default::default(),
            gateway: Default::default(),
            problems: Vec::new(),
            left_out_why: Default::default(),
            gateway_bad: Default::default(),
            plan: None,
            wrote_status: None,
        }
    }

    /// Forgets what was applied: the next build is applied even if nothing changed.
    pub fn invalidate(&mut self) {
        self.applied = None;
        self.plan = None;
        self.structure = None;
        self.left_out.clear();
    }

    /// Builds and applies the config for `world`. Returns the Ingresses served (for their
    /// status), or the reason the running config stays.
    pub fn apply(&mut self, world: &World) -> Result<Vec<Arc<Ingress>>, BuildError> {
        let began = std::time::Instant::now();
        self.plan = None;
        let mut ours: Vec<Arc<Ingress>> = world
            .ingresses
            .iter()
            .filter(|i| objects::ours(i, &self.spec, &world.classes))
            // Left out before, and unchanged since: not tried again.
            .filter(|i| self.left_out.get(&id(&i.metadata)) != Some(&version(i)))
            .cloned()
            .collect();
        ours.sort_by_key(|i| id(&i.metadata));
        self.left_out
            .retain(|k, _| world.ingresses.iter().any(|i| id(&i.metadata) == *k));
        let left_out = &self.left_out;
        self.left_out_why.retain(|k, _| left_out.contains_key(k));
        let translated = self.merged(world, &ours, Gw::On);
        let translate_ms = began.elapsed().as_secs_f64() * 1e3;
        let all = translated.and_then(|m| self.compile(m));
        let (mut merged, snapshot) = match all {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(error = %e, "kubernetes: the config with every object is refused; finding the objects that break it");
                ours = self.without_bad(world, ours);
                let again = self
                    .merged(world, &ours, Gw::On)
                    .and_then(|m| self.compile(m));
                match again {
                    Ok(done) => done,
                    Err(_) => self.without_bad_routes(world, &ours)?,
                }
            }
        };
        let translated = &merged.gateway_routes;
        self.gateway_bad.retain(|k, _| translated.contains(k));
        let notes: std::collections::BTreeSet<String> = merged.notes.iter().cloned().collect();
        for n in notes.difference(&self.reported) {
            tracing::warn!("kubernetes: {n}");
        }
        self.reported = notes;
        self.gateway = std::mem::take(&mut merged.gateway);
        self.problems = std::mem::take(&mut merged.problems);
        for (ing, why) in &self.left_out_why {
            let note = format!("left out: it cannot be served: {why}");
            if let Some(p) = Problem::from_loc(&format!("Ingress {ing}"), "Invalid", note) {
                self.problems.push(p);
            }
        }
        let snapshot = match (snapshot, merged.in_place.take()) {
            (None, None) => {
                self.keep_plan(world, merged);
                return Ok(ours);
            }
            (None, Some(sets)) => match self.apply_servers(sets, merged.fingerprint, began) {
                Ok(()) => {
                    self.keep_plan(world, merged);
                    return Ok(ours);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "kubernetes: servers could not change in place; building the whole config");
                    self.snapshot(&merged.text())?
                }
            },
            (Some(snapshot), _) => snapshot,
        };
        self.running.reload(snapshot).map_err(BuildError::Reload)?;
        self.applied = Some(merged.fingerprint);
        self.structure = Some(merged.structure);
        self.running_servers = merged.servers.plain.clone();
        self.keep_plan(world, merged);
        let took_ms = began.elapsed().as_secs_f64() * 1e3;
        tracing::info!(
            ingresses = ours.len(),
            took_ms = format!("{took_ms:.1}"),
            translate_ms = format!("{translate_ms:.1}"),
            "kubernetes: config applied"
        );
        Ok(ours)
    }

    /// Gives the running groups their new server sets in place (see [`in_place`]) and
    /// records them as running.
    fn apply_servers(
        &mut self,
        sets: in_place::Sets,
        fingerprint: u64,
        began: std::time::Instant,
    ) -> Result<(), String> {
        let applying = Timer::start();
        self.running.set_servers(&sets)?;
        let (apply_ms, apply_cpu_ms) = applying.ms();
        tracing::info!(
            groups = sets.len(),
            took_ms = format!("{:.1}", began.elapsed().as_secs_f64() * 1e3),
            apply_ms = format!("{apply_ms:.2}"),
            apply_cpu_ms = format!("{apply_cpu_ms:.2}"),
            translated = true,
            "kubernetes: servers changed in place"
        );
        for (g, s) in sets {
            self.running_servers.insert(g, Some(s));
        }
        self.applied = Some(fingerprint);
        Ok(())
    }

    /// Keeps what `merged` (applied, from `world`) says about its servers, for
    /// [`Builder::apply_endpoints`].
    fn keep_plan(&mut self, world: &World, merged: Merged) {
        self.plan = Some(Plan::new(world, merged.origins, merged.servers));
    }

    /// Applies a change of EndpointSlices alone (`slices`: [`super::watch::Caches::slices`])
    /// without translating anything, when the last full build's plan allows it (see
    /// [`super::endpoints_only`]). Returns false when a full build is needed.
    pub fn apply_endpoints(&mut self, slices: &World) -> bool {
        let began = std::time::Instant::now();
        let Some(mut update) = self.plan.as_ref().and_then(|p| p.changes(slices)) else {
            return false;
        };
        let sets = std::mem::take(&mut update.sets);
        if !sets.is_empty() {
            let applying = Timer::start();
            if let Err(e) = self.running.set_servers(&sets) {
                tracing::warn!(error = %e, "kubernetes: servers could not change in place; building the whole config");
                self.plan = None;
                return false;
            }
            let (apply_ms, apply_cpu_ms) = applying.ms();
            tracing::info!(
                groups = sets.len(),
                services = update.services,
                took_ms = format!("{:.1}", began.elapsed().as_secs_f64() * 1e3),
                apply_ms = format!("{apply_ms:.2}"),
                apply_cpu_ms = format!("{apply_cpu_ms:.2}"),
                translated = false,
                "kubernetes: servers changed in place"
            );
        }
        for (g, s) in sets {
            self.running_servers.insert(g, Some(s));
        }
        let plan = self.plan.as_mut().expect("checked above");
        self.applied = Some(plan.commit(update));
        true
    }

    /// `ours` without each Ingress that, alone with the file, does not compile (logged, and
    /// remembered with its version so that it is not tried again until it changes).
    fn without_bad(&mut self, world: &World, ours: Vec<Arc<Ingress>>) -> Vec<Arc<Ingress>> {
        let mut good = Vec::new();
        for ing in ours {
            let alone = std::slice::from_ref(&ing);
            match self
                .merged(world, alone, Gw::Off)
                .and_then(|m| self.check(&m.text()))
            {
                Ok(()) => good.push(ing),
                Err(e) => {
                    tracing::error!(ingress = %id(&ing.metadata), error = %e, "kubernetes: Ingress left out: it cannot be served");
                    self.left_out.insert(id(&ing.metadata), version(&ing));
                    self.left_out_why.insert(id(&ing.metadata), e.to_string());
                }
            }
        }
        good
    }

    /// The config without each Gateway API route that, alone with the file and `ours`, does
    /// not compile (remembered in `gateway_bad`); without any Gateway API route when it still
    /// does not compile (a certificate that does not load, say).
    fn without_bad_routes(
        &mut self,
        world: &World,
        ours: &[Arc<Ingress>],
    ) -> Result<(Merged, Option<Snapshot>), BuildError> {
        let all = self.merged(world, ours, Gw::On)?;
        for key in &all.gateway_routes {
            if self.gateway_bad.contains_key(key) {
                continue;
            }
            let alone = self.merged(world, ours, Gw::Only(key));
            if let Err(e) = alone.and_then(|m| self.check(&m.text())) {
                self.gateway_bad.insert(key.clone(), e.to_string());
            }
        }
        match self
            .merged(world, ours, Gw::On)
            .and_then(|m| self.compile(m))
        {
            Ok(done) => Ok(done),
            Err(e) => {
                tracing::error!(error = %e, "kubernetes: the Gateway API objects are left out: with them the config is refused");
                self.merged(world, ours, Gw::Off)
                    .and_then(|m| self.compile(m))
            }
        }
    }

    /// Compiles `m` unless it is what runs already, or differs from it in servers only
    /// (`None` then, with `m.in_place` set in the second case).
    fn compile(&self, mut m: Merged) -> Result<(Merged, Option<Snapshot>), BuildError> {
        if self.applied == Some(m.fingerprint) {
            return Ok((m, None));
        }
        if self.structure == Some(m.structure) {
            if let Some(sets) = in_place::changes(&self.running_servers, &m.servers.plain) {
                m.in_place = Some(sets);
                return Ok((m, None));
            }
        }
        let snapshot = self.snapshot(&m.text())?;
        Ok((m, Some(snapshot)))
    }

    fn check(&self, text: &str) -> Result<(), BuildError> {
        self.snapshot(text).map(drop)
    }

    fn snapshot(&self, text: &str) -> Result<Snapshot, BuildError> {
        // Against the snapshot being served: the routes of unchanged objects are reused.
        let current = self.running.snapshot();
        let s = compile_str_after(self.config_path, text, &self.policies, Some(&current));
        drop(current);
        let s = s.map_err(|source| {
            let merged = self.dir.join("merged.toml");
            let _ = std::fs::write(&merged, text);
            BuildError::Compile { merged, source }
        })?;
        for w in &s.warnings {
            tracing::debug!("kubernetes: {w}");
        }
        Ok(s)
    }

    /// The file's config with `ours` (and the Gateway API routes `gateways` says) translated
    /// into it, and the generated files written.
    fn merged(
        &self,
        world: &World,
        ours: &[Arc<Ingress>],
        gateways: Gw<'_>,
    ) -> Result<Merged, BuildError> {
        let mut table = self.file.clone();
        let mut notes = Vec::new();
        let mut problems = Vec::new();
        let mut hasher = DefaultHasher::new();
        let mut ingress_sources = None;
        let (mut gateway_sources, mut gateway_opaque) = Default::default();
        if !ours.is_empty() {
            let docs = self.docs.borrow_mut().documents(world, ours);
            let opts = Options {
                out_dir: self.dir.clone(),
                services: objects::endpoints(world, ours),
                ..Default::default()
            };
            let (imported, sources) = veloxy_import_ingress::import_docs_with_sources(&docs, &opts)
                .map_err(BuildError::Translate)?;
            ingress_sources = Some(sources);
            for e in &imported.report.entries {
                if let Outcome::Refused(why) = &e.outcome {
                    notes.push(format!(
                        "{}: {}: not served: {why}",
                        e.loc.file, e.directive
                    ));
                    let note = format!("{}: not served: {why}", e.directive);
                    problems.extend(Problem::from_loc(&e.loc.file, "Refused", note));
                }
            }
            for f in &imported.config.files {
                let path = self.dir.join(&f.name);
                write_private(&path, &f.contents)
                    .map_err(|source| BuildError::Write { path, source })?;
                f.name.hash(&mut hasher);
                f.contents.hash(&mut hasher);
            }
            notes.extend(merge(&mut table, &imported.config, &self.spec, &self.dir));
        }
        let mut report = gateway::Report::default();
        let mut gateway_routes = Vec::new();
        if !matches!(gateways, Gw::Off) {
            let mut t = gateway::translate(world, &self.spec, &self.file, &self.dir);
            for (name, contents) in &t.files {
                let path = self.dir.join(name);
                write_private(&path, contents)
                    .map_err(|source| BuildError::Write { path, source })?;
                name.hash(&mut hasher);
                contents.hash(&mut hasher);
            }
            let (mut routes, mut streams) = (Vec::new(), Vec::new());
            for (route, (kind, ns, name)) in t.routes.into_iter().zip(t.origins) {
                let key = route.to_string();
                let keep = match gateways {
                    Gw::Only(only) => key == only,
                    _ => !self.gateway_bad.contains_key(&key),
                };
                if let Some(why) = self.gateway_bad.get(&key) {
                    let note = format!("a route of it is left out: {why}");
                    notes.push(format!("{kind} {ns}/{name}: {note}"));
                    t.problems
                        .push(Problem::new(kind, Some(&ns), &name, "Invalid", note));
                }
                if keep && gateway::is_stream(kind) {
                    streams.push(route);
                } else if keep {
                    routes.push(route);
                }
                gateway_routes.push(key);
            }
            notes.extend(t.notes);
            problems.extend(t.problems);
            gateway_sources = t.sources;
            gateway_opaque = t.opaque;
            let made = (t.upstreams, t.listeners);
            super::merge::add_gateway(&mut table, (routes, streams), made, t.certs);
            report = t.report;
        }
        let servers = Servers::take(&mut table);
        render(&table).hash(&mut hasher);
        let structure = hasher.finish();
        let origins = Origins {
            structure: hasher.clone(),
            ingress: ingress_sources,
            gateway: gateway_sources,
            gateway_opaque,
        };
        servers.hash(&mut hasher);
        Ok(Merged {
            table,
            servers,
            structure,
            fingerprint: hasher.finish(),
            in_place: None,
            origins,
            notes,
            problems,
            gateway: report,
            gateway_routes,
        })
    }
}

impl Merged {
    /// The merged config's text.
    fn text(&self) -> String {
        render(&self.servers.put_back(&self.table))
    }
}

/// An object's `metadata.resourceVersion` (it changes with every write).
fn version(ing: &Ingress) -> String {
    ing.metadata.resource_version.clone().unwrap_or_default()
}

/// Writes `contents` to `path` (mode 0600, through a temporary file and a rename), unless
/// the file already holds them.
fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|c| c == contents) {
        return Ok(());
    }
    // The engine's writer: the directory 0700, the file 0600, written whole and renamed.
    veloxy_engine::acme::storage::write_private(path, contents.as_bytes())
}

#[cfg(test)]
mod tests;

/// Wall and CPU time of a step of this thread. The provider's thread runs at a lower priority
/// than the workers (`background::lower_priority`), so under load a worker's wake-up preempts
/// it: the wall time of an in-place change then counts the requests served meanwhile, the CPU
/// time only the change's own work. The log gives both.
struct Timer {
    wall: std::time::Instant,
    cpu: f64,
}

impl Timer {
    fn start() -> Timer {
        Timer {
            wall: std::time::Instant::now(),
            cpu: veloxy_engine::background::thread_cpu_ms(),
        }
    }

    /// (wall, CPU) milliseconds since [`Timer::start`].
    fn ms(&self) -> (f64, f64) {
        let wall = self.wall.elapsed().as_secs_f64() * 1e3;
        (wall, veloxy_engine::background::thread_cpu_ms() - self.cpu)
    }
}
