//! Docs that cannot rot: the book in `docs/src` and the README are checked against the code.
//!
//! * [`every_config_key_has_a_reference_entry`]: each key veloxy's parser accepts has an
//!   `<a id="PATH">` anchor in `docs/src/reference/` (and no anchor there names a key that is
//!   no longer accepted). The key set is read from veloxy itself, not from a hand list: see
//!   `support/docs_keys.rs` for how and why.
//! * [`every_toml_example_passes_check`]: every ```` ```toml ```` block of the book and the
//!   README is a whole config that the real `veloxy check --config` accepts, unless it is
//!   marked as a fragment (then it must at least parse as TOML). The conventions for marking
//!   fragments and for the files an example names are in `docs/src/contributing.md`
//!   ("Examples in the docs"), and below in [`BlockSetup`].
//! * [`no_broken_internal_link`]: every relative link of the book and the README names a file
//!   that exists, and its `#anchor` one that the target page defines (an mdBook heading id or
//!   an explicit `id="..."`); every page is listed in `SUMMARY.md`.

#[path = "support/docs_keys.rs"]
mod docs_keys;
#[path = "support/docs_markdown.rs"]
mod docs_markdown;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use docs_markdown::{anchors_of, code_blocks, links_of, Block};

/// The repository root (two levels above this crate).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Every `.md` file under `docs/src`, sorted.
fn book_pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo().join("docs/src"), &mut out);
    out.sort();
    assert!(out.len() > 10, "docs/src has too few pages: {out:?}");
    out
}

/// The book's pages and the README: every file whose examples and links are checked.
fn checked_files() -> Vec<PathBuf> {
    let mut files = book_pages();
    files.push(repo().join("README.md"));
    files
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_config_key_has_a_reference_entry() {
    let accepted = docs_keys::accepted_keys();
    // The walk must have found the nested tables, or it checks little: a few known keys.
    for key in [
        "server.access_log.format",
        "listeners.tls.certs.hosts",
        "upstreams.servers.weight",
    ] {
        assert!(
            accepted.required.contains(key),
            "key walk missed {key}: {accepted:?}"
        );
    }
    let mut documented = BTreeSet::new();
    for page in book_pages() {
        if page.parent().unwrap().ends_with("reference") {
            documented.extend(anchors_of(&read(&page)).explicit);
        }
    }
    let missing: Vec<&String> = accepted.required.difference(&documented).collect();
    let sections: BTreeSet<&str> = accepted
        .all
        .iter()
        .map(|k| k.split('.').next().unwrap())
        .collect();
    // An anchor that looks like a key (its first segment a top-level section) but names none.
    let stale: Vec<&String> = documented
        .iter()
        .filter(|a| sections.contains(a.split('.').next().unwrap()) && !accepted.all.contains(*a))
        .collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "config keys without an entry (<a id=\"KEY\"></a>) in docs/src/reference/: {missing:#?}\n\
         reference entries for keys veloxy does not accept: {stale:#?}"
    );
}

/// What the test creates in a block's temp dir before `veloxy check`, from the HTML comments
/// right before the block: `<!-- files: A DIR/ CERT+KEY tsig:KEYFILE -->`.
#[derive(Default)]
struct BlockSetup {
    /// `NAME/`: a directory.
    dirs: Vec<String>,
    /// `CERT+KEY`: a certificate for `localhost` and its key.
    certs: Vec<(String, String)>,
    /// `tsig:NAME`: a TSIG key file as `tsig-keygen -a hmac-sha256 acme` writes it.
    tsig: Vec<String>,
    /// Any other name: a file holding [`EXAMPLE_FILE_TEXT`].
    files: Vec<String>,
}

/// The text of the plain files an example names: an htpasswd line (user `docs`, password
/// `example`, bcrypt) that is also long enough for an `admin_token_file`.
const EXAMPLE_FILE_TEXT: &str =
    "docs:$2y$05$rPGIKnIjPtReS0r/d3tv9OpeblJnEScvYMVtFlYMMiDNcEBEcB8yO\n";

/// The text of a `tsig:NAME` file: BIND's `key` statement for the key `acme` (a made-up
/// secret).
const EXAMPLE_TSIG_KEY: &str = "key \"acme\" {\n\talgorithm hmac-sha256;\n\
     \tsecret \"ZG9jcy1leGFtcGxlLXRzaWcta2V5LW5vdC1hLXNlY3JldDA=\";\n};\n";

impl BlockSetup {
    fn of(block: &Block) -> BlockSetup {
        let mut setup = BlockSetup::default();
        for name in block.files.iter() {
            if let Some(key) = name.strip_prefix("tsig:") {
                setup.tsig.push(key.to_owned());
            } else if let Some(dir) = name.strip_suffix('/') {
                setup.dirs.push(dir.to_owned());
            } else if let Some((cert, key)) = name.split_once('+') {
                setup.certs.push((cert.to_owned(), key.to_owned()));
            } else {
                setup.files.push(name.clone());
            }
        }
        setup
    }

    fn create(&self, dir: &Path) {
        for d in &self.dirs {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        for f in &self.files {
            let path = dir.join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, EXAMPLE_FILE_TEXT).unwrap();
        }
        for f in &self.tsig {
            std::fs::write(dir.join(f), EXAMPLE_TSIG_KEY).unwrap();
        }
        if !self.certs.is_empty() {
            let pki = veloxy_testkit::tls::Pki::new(dir);
            for (cert, key) in &self.certs {
                let (c, k) = pki.leaf(
                    "example-leaf",
                    &["localhost"],
                    veloxy_testkit::tls::KeyKind::Ecdsa,
                );
                std::fs::rename(c, dir.join(cert)).unwrap();
                std::fs::rename(k, dir.join(key)).unwrap();
            }
        }
    }
}

#[test]
fn every_toml_example_passes_check() {
    let mut failures = Vec::new();
    let (mut whole, mut fragments) = (0, 0);
    for file in checked_files() {
        let shown = file
            .strip_prefix(repo())
            .unwrap_or(&file)
            .display()
            .to_string();
        for block in code_blocks(&read(&file))
            .into_iter()
            .filter(|b| b.lang == "toml")
        {
            let place = format!("{shown}:{}", block.line);
            if block.fragment {
                fragments += 1;
                if let Err(e) = block.text.parse::<toml::Table>() {
                    failures.push(format!("{place}: fragment is not TOML: {e}"));
                }
                continue;
            }
            whole += 1;
            let dir = tempfile::tempdir().unwrap();
            BlockSetup::of(&block).create(dir.path());
            let config = dir.path().join("veloxy.toml");
            std::fs::write(&config, &block.text).unwrap();
            let out = Command::new(veloxy_testkit::VELOXY)
                .args(["check", "--config"])
                .arg(&config)
                .output()
                .unwrap();
            if !out.status.success() {
                failures.push(format!(
                    "{place}: veloxy check failed (mark a partial example `<!-- fragment -->`):\n{}",
                    veloxy_testkit::output_text(&out)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The book has whole examples in every guide; a parser that found none checks nothing.
    assert!(
        whole >= 15 && fragments >= 3,
        "only {whole} whole examples and {fragments} fragments found"
    );
}

#[test]
fn no_broken_internal_link() {
    let src = repo().join("docs/src");
    let summary = read(&src.join("SUMMARY.md"));
    let listed: BTreeSet<PathBuf> = links_of(&summary)
        .into_iter()
        .map(|l| src.join(l.target.split('#').next().unwrap()))
        .collect();
    let mut failures = Vec::new();
    for page in book_pages() {
        if !page.ends_with("SUMMARY.md") && !listed.contains(&page) {
            failures.push(format!("{}: not listed in SUMMARY.md", page.display()));
        }
    }
    for file in checked_files() {
        let text = read(&file);
        let shown = file
            .strip_prefix(repo())
            .unwrap_or(&file)
            .display()
            .to_string();
        for link in links_of(&text) {
            let target = link.target.as_str();
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target, None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let place = format!("{shown}:{}: ({target})", link.line);
            if !resolved.exists() {
                failures.push(format!("{place}: no such file {}", resolved.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                if resolved.extension().is_none_or(|e| e != "md") {
                    failures.push(format!("{place}: an anchor into a file that is not a page"));
                } else if !anchors_of(&read(&resolved)).all().contains(anchor) {
                    failures.push(format!(
                        "{place}: no anchor #{anchor} in {}",
                        resolved.display()
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "broken links:\n{}",
        failures.join("\n")
    );
}

/// The README stays a front door (issue 35): under 10,000 bytes, with the two commands CI
/// relies on (`.ci/run` runs the README's test command), pointing into the book.
#[test]
fn readme_is_a_front_door() {
    let readme = read(&repo().join("README.md"));
    assert!(
        readme.len() < 10_000,
        "README.md is {} bytes: move detail into docs/src",
        readme.len()
    );
    for needed in [
        "cargo run --release -- run",
        "cargo test --workspace",
        "docs/src/getting-started.md",
    ] {
        assert!(readme.contains(needed), "README.md lacks {needed:?}");
    }
}
