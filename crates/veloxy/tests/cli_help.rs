//! The command line as documentation (issue 35): `--help` of every subcommand documents every
//! flag and the default of every option that takes a value; `veloxy completions SHELL` prints
//! a working completion script naming every subcommand; the man page (`veloxy manpage`, which
//! the Debian package ships) has NAME and SYNOPSIS and documents every subcommand and flag.
//! The subcommands and flags are read from the real binary's `--help`, so a new one is
//! checked without editing this file.

use std::process::{Command, Output};

use veloxy_testkit::{require, VELOXY};

fn veloxy(args: &[&str]) -> Output {
    let out = Command::new(VELOXY)
        .args(args)
        .output()
        .expect("run veloxy");
    assert!(
        out.status.success(),
        "veloxy {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(args: &[&str]) -> String {
    String::from_utf8(veloxy(args).stdout).expect("utf-8 output")
}

/// One entry of a help section: `-c, --config <FILE>` and its description.
#[derive(Debug)]
struct Entry {
    head: String,
    description: String,
}

impl Entry {
    /// `--config` (or `-c`, or the positional `<FILE>...` when there is no flag).
    fn flag(&self) -> &str {
        let words = self.head.split([',', ' ']).filter(|w| !w.is_empty());
        let mut words: Vec<&str> = words.collect();
        words.sort_by_key(|w| !w.starts_with("--"));
        words[0]
    }

    fn takes_value(&self) -> bool {
        self.head.starts_with('-') && self.head.contains('<')
    }
}

/// The entries of the `Options:` and `Arguments:` sections of a clap help text, in either of
/// clap's layouts: the description on the flag's line (after two or more spaces) or on the
/// lines below it, indented further.
fn entries(help: &str) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    let mut in_section = false;
    for line in help.lines() {
        if !line.starts_with(' ') {
            in_section = matches!(line.trim_end(), "Options:" | "Arguments:");
            continue;
        }
        if !in_section || line.trim().is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let body = line.trim();
        let starts_entry = indent <= 6 && (body.starts_with('-') || body.starts_with('<'));
        if starts_entry {
            let (head, description) = match body.find("  ") {
                Some(i) => (&body[..i], body[i..].trim()),
                None => (body, ""),
            };
            out.push(Entry {
                head: head.to_owned(),
                description: description.to_owned(),
            });
        } else if let Some(last) = out.last_mut() {
            last.description.push(' ');
            last.description.push_str(body);
        }
    }
    out
}

/// The visible subcommands, from the `Commands:` section of `veloxy --help` (without clap's
/// own `help`).
fn subcommands() -> Vec<String> {
    let help = stdout(&["--help"]);
    let section = help
        .split("Commands:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no Commands: section in\n{help}"));
    let names: Vec<String> = section
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect();
    assert!(names.len() >= 6, "{help}");
    names
}

#[test]
fn every_flag_in_help_has_a_description_and_every_value_a_default() {
    let mut helps = vec![(String::from("veloxy"), stdout(&["--help"]))];
    for sub in subcommands() {
        helps.push((format!("veloxy {sub}"), stdout(&[&sub, "--help"])));
    }
    for (cmd, help) in helps {
        let found = entries(&help);
        assert!(found.iter().any(|e| e.flag() == "--help"), "{cmd}: {help}");
        for e in found {
            assert!(
                e.description.len() > 3,
                "{cmd} {}: no description\n{help}",
                e.head
            );
            // An option taking a value says what happens without it.
            let stated = e.description.contains("[default: ") || e.description.contains("required");
            assert!(
                !e.takes_value() || stated,
                "{cmd} {}: neither a [default: ...] nor `required`: {}",
                e.head,
                e.description
            );
        }
    }
}

#[test]
fn completions_for_each_shell_name_every_subcommand() {
    let subs = subcommands();
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout(&["completions", shell]);
        assert!(script.len() > 1000, "{shell}: {script}");
        for sub in &subs {
            assert!(script.contains(sub.as_str()), "{shell}: no {sub}");
        }
        // Long flags of the subcommands are completed too.
        assert!(script.contains("acme-http-listen"), "{shell}");
        // The hidden packaging command is not offered.
        assert!(!script.contains("manpage"), "{shell}");
    }
    let bad = Command::new(VELOXY)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

/// What bash's completion offers for the words of a command line (the last one being typed).
fn bash_completes(words: &[&str]) -> String {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let script = format!(
        "source <({VELOXY} completions bash)\n\
         COMP_WORDS=({words}); COMP_CWORD={cword}\n\
         _veloxy veloxy {cur} {prev}\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        words = quoted.join(" "),
        cword = words.len() - 1,
        cur = quoted[words.len() - 1],
        prev = quoted[words.len() - 2],
    );
    let out = Command::new("bash")
        .args(["--norc", "-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn bash_completion_completes_subcommands_and_flags() {
    if !require("bash", "--version", "bash is not installed") {
        return;
    }
    assert_eq!(bash_completes(&["veloxy", "se"]).trim(), "serve");
    assert_eq!(
        bash_completes(&["veloxy", "serve", "--acme-h"]).trim(),
        "--acme-http-listen"
    );
    let shells = bash_completes(&["veloxy", "completions", ""]);
    for shell in ["bash", "zsh", "fish"] {
        assert!(shells.lines().any(|l| l == shell), "{shells}");
    }
}

#[test]
fn man_page_has_name_synopsis_and_every_subcommand_and_flag() {
    let roff = stdout(&["manpage"]);
    assert!(roff.contains(".TH veloxy 1 "), "{roff}");
    for section in [
        ".SH NAME",
        ".SH SYNOPSIS",
        ".SH DESCRIPTION",
        ".SH COMMANDS",
    ] {
        assert!(roff.contains(section), "no {section}");
    }
    for section in ["SIGNALS", "FILES", "\"EXIT STATUS\"", "EXAMPLES"] {
        assert!(roff.contains(&format!(".SH {section}")), "no {section}");
    }
    // The hidden command documents the others, not itself; clap's `help` is left out too.
    assert!(!roff.contains("veloxy manpage"));
    assert!(!roff.contains(".SS \"veloxy help\""));
    for sub in subcommands() {
        let heading = format!(".SS \"veloxy {sub}\"");
        let at = roff
            .find(&heading)
            .unwrap_or_else(|| panic!("no {heading}"));
        // The subsection: from its heading to the next one (or the next section).
        let rest = &roff[at + heading.len()..];
        let end = [rest.find(".SS "), rest.find(".SH ")]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(rest.len());
        let body = &rest[..end];
        // Its synopsis line, then every flag of its --help.
        assert!(body.contains(&format!("\\fBveloxy {sub}\\fR")), "{body}");
        for e in entries(&stdout(&[&sub, "--help"])) {
            let flag = e.flag().replace('-', "\\-");
            let flag = flag.trim_end_matches("...");
            let flag = flag.trim_start_matches('<').trim_end_matches('>');
            assert!(body.contains(flag), "veloxy {sub}: {flag} not in\n{body}");
        }
    }
}

#[test]
fn man_page_renders() {
    if !require("groff", "--version", "groff is not installed") {
        return;
    }
    let roff = veloxy(&["manpage"]).stdout;
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("veloxy.1");
    std::fs::write(&page, roff).unwrap();
    let out = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .arg(&page)
        .output()
        .unwrap();
    // -z: no output, only the warnings (-ww: all of them) on stderr.
    let warnings = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && warnings.trim().is_empty(),
        "{warnings}"
    );
    let text = Command::new("groff")
        .args(["-man", "-Tutf8"])
        .arg(&page)
        .output()
        .unwrap();
    // grotty's bold is overstrike (`N\bN`): dropping each character before a backspace
    // leaves the plain text.
    let mut plain = String::new();
    for c in String::from_utf8_lossy(&text.stdout).chars() {
        if c == '\u{8}' {
            plain.pop();
        } else {
            plain.push(c);
        }
    }
    let text = plain;
    for heading in ["NAME", "SYNOPSIS", "COMMANDS", "SIGNALS"] {
        assert!(text.lines().any(|l| l.contains(heading)), "{text}");
    }
}
