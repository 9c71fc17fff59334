//! `veloxy import --from traefik`: Traefik v2/v3 configurations (the static file, dynamic
//! files in YAML or TOML, docker-compose files with `traefik.*` labels) as a veloxy config.
//!
//! # Layout
//! * [`input`], [`compose`], [`node`]: reading the files into one set of static trees and
//!   dynamic objects (case-insensitive keys, label lists, Go durations).
//! * [`rule`], [`matcher`], [`hostre`]: the router rule language (a parser and the
//!   disjunctive normal form) and its branches as veloxy route matches.
//! * [`translate`] runs the parts: [`entry`] (entry points, resolvers, providers),
//!   [`router`], [`middleware`] with [`headers`], [`auth`] and [`urlre`] (redirectRegex),
//!   [`service`], [`tls`], [`tcp`], [`order`] (where Traefik's priorities and veloxy's
//!   precedence disagree); [`route`] is the route being built, [`lines`] the report lines.
//! * [`labels`] and [`dotenv`]: the docker provider's defaults for compose containers
//!   (`exposedByDefault`, `defaultRule`, ports) and compose's `.env` placeholders.
//! * [`ops`]: the dashboard, ping, metrics and logs (the admin endpoint, `[server]` keys);
//!   [`v1`]: Traefik v1 syntax, recognized and refused.

#![warn(missing_docs)]

use std::path::{Path, PathBuf};

use veloxy_import::{ImportError, Imported, Importer, Options};

pub mod auth;
pub mod compose;
pub mod dotenv;
pub mod entry;
pub mod headers;
pub mod hostre;
pub mod input;
pub mod labels;
pub mod lines;
pub mod matcher;
pub mod middleware;
pub mod node;
pub mod ops;
pub mod order;
pub mod route;
pub mod router;
pub mod rule;
pub mod service;
pub mod tcp;
pub mod tls;
pub mod translate;
pub mod urlre;
pub mod v1;

/// The traefik importer.
pub struct Traefik;

impl Importer for Traefik {
    fn name(&self) -> &'static str {
        "traefik"
    }

    /// A static file (`entryPoints`, `providers`), a dynamic one (`http:` with `routers`) or
    /// a compose file whose services carry `traefik.` labels.
    fn detect(&self, path: &Path, text: &str) -> bool {
        input::kind(path, text).is_some()
    }

    fn import(&self, files: &[PathBuf], opts: &Options) -> Result<Imported, ImportError> {
        translate::run(files, opts)
    }
}
