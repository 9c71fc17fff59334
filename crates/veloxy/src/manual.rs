//! `veloxy completions SHELL` and the hidden `veloxy manpage`: the shell completion scripts
//! and the roff man page, both generated from the clap definition in [`crate::cli`] so they
//! cannot drift from the real flags. The Debian package ships their output
//! (`.ci/deb.sh` runs the built binary to make them).

use std::io::{self, Write};

use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::Man;

use crate::cli::Cli;

/// The binary name completions are registered for.
const BIN: &str = "veloxy";

/// Writes the completion script for `shell` to `out`.
///
/// clap_complete offers hidden subcommands too, so the script is generated from a copy of the
/// command that has only the visible ones (the top level has no flag of its own besides
/// `--help` and `--version`, which clap adds to the copy as well).
pub fn completions(shell: Shell, out: &mut dyn Write) -> io::Result<()> {
    let full = Cli::command();
    let mut visible = clap::Command::new(BIN)
        .version(crate::cli::VERSION)
        .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    // clap_complete panics when the writer fails (a closed pipe): it writes to memory here and
    // a write error is returned instead.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut visible, BIN, &mut script);
    out.write_all(&script)?;
    out.flush()
}

/// Man page sections written by hand after the generated ones: signals, files, exit status.
const EXTRA_SECTIONS: &str = r#".SH SIGNALS
.TP
\fBSIGHUP\fR
Reload the config file (\fBveloxy run \-\-config\fR): it is parsed and validated first; a file
with an error is refused and the running config stays. Ignored without a config file.
.TP
\fBSIGUSR1\fR
Reopen the access log (after log rotation). Ignored without an access log.
.TP
\fBSIGTERM\fR, \fBSIGINT\fR
Stop accepting, finish in-flight requests, then exit.
.SH FILES
.TP
\fI/etc/veloxy/veloxy.toml\fR
The config file of the packaged service (\fBveloxy.service\fR); check it with
\fBveloxy check \-\-config /etc/veloxy/veloxy.toml\fR, reload it with
\fBsystemctl reload veloxy\fR.
.SH "EXIT STATUS"
.TP
0
Success (for \fBrun\fR, \fBproxy\fR and \fBserve\fR: after a clean stop).
.TP
1
The config is refused (\fBcheck\fR), the server cannot start, or
\fBimport \-\-strict\fR refused a directive.
.TP
2
A usage error, or \fBimport\fR cannot tell the source format.
.SH "SEE ALSO"
\fBsystemctl\fR(1), \fBjournalctl\fR(1); the veloxy book in the source tree's \fIdocs/\fR.
"#;

/// Writes the man page, `veloxy(1)`: NAME; SYNOPSIS with one line per subcommand;
/// DESCRIPTION; OPTIONS; COMMANDS with each visible subcommand's synopsis, description and
/// options (one page for the whole command, so `man veloxy` documents every flag); EXAMPLES;
/// then [`EXTRA_SECTIONS`].
pub fn manpage(out: &mut dyn Write) -> io::Result<()> {
    let mut cmd = Cli::command();
    // Gives every subcommand its full bin name (`veloxy run`) for its synopsis line.
    cmd.build();
    let man = Man::new(cmd.clone())
        .date(env!("VELOXY_BUILD_DATE"))
        .source(concat!("veloxy ", env!("CARGO_PKG_VERSION")))
        .manual("User Commands");
    // `help` is clap's own subcommand (`veloxy help run` = `veloxy run --help`).
    let documented: Vec<&clap::Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .collect();
    let name_of = |sub: &clap::Command| sub.get_bin_name().unwrap_or(sub.get_name()).to_owned();
    man.render_title(out)?;
    man.render_name_section(out)?;
    writeln!(out, ".SH SYNOPSIS")?;
    for sub in &documented {
        writeln!(out, "{}\n.br", synopsis(&name_of(sub), sub))?;
    }
    writeln!(
        out,
        "\\fBveloxy\\fR \\fB\\-\\-help\\fR | \\fB\\-\\-version\\fR"
    )?;
    let mut top = Vec::new();
    man.render_description_section(&mut top)?;
    man.render_options_section(&mut top)?;
    out.write_all(code_spans(&String::from_utf8_lossy(&top)).as_bytes())?;
    writeln!(out, ".SH COMMANDS")?;
    for sub in documented {
        let name = name_of(sub);
        writeln!(out, ".SS \"{name}\"")?;
        writeln!(out, "{}\n.PP", synopsis(&name, sub))?;
        let sub_man = Man::new(sub.clone());
        // Each rendered section starts with its own `.SH TITLE` line: dropped, so the parts
        // sit under this subsection.
        for render in [Man::render_description_section, Man::render_options_section] {
            let mut buf = Vec::new();
            render(&sub_man, &mut buf)?;
            out.write_all(code_spans(&body_of(&buf)).as_bytes())?;
            writeln!(out, ".PP")?;
        }
    }
    writeln!(out, ".SH EXAMPLES\n.nf")?;
    let examples = crate::cli::AFTER_HELP
        .split("\n\n")
        .next()
        .unwrap_or_default();
    for line in examples.lines().skip(1) {
        writeln!(out, "{}", roff_escape(line.trim()))?;
    }
    writeln!(out, ".fi")?;
    out.write_all(EXTRA_SECTIONS.as_bytes())?;
    out.flush()
}

/// One roff line: `veloxy import [--from FORMAT] ... FILE...`, every visible argument with its
/// value name (clap_mangen's own synopsis leaves the value names out), optional ones in
/// brackets, positionals last.
fn synopsis(name: &str, cmd: &clap::Command) -> String {
    let mut line = format!("\\fB{}\\fR", roff_escape(name));
    let args = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !matches!(a.get_id().as_str(), "help" | "version"));
    let (positionals, options): (Vec<_>, Vec<_>) = args.partition(|a| a.is_positional());
    for arg in options.into_iter().chain(positionals) {
        let value = arg
            .get_value_names()
            .map(|v| v.join(" "))
            .filter(|_| arg.get_num_args().is_some_and(|n| n.takes_values()));
        let repeated = arg.get_num_args().is_some_and(|n| n.max_values() > 1)
            || matches!(arg.get_action(), clap::ArgAction::Append);
        let mut text = match (arg.get_long(), arg.get_short(), &value) {
            (Some(long), _, _) => format!("\\fB\\-\\-{}\\fR", roff_escape(long)),
            (None, Some(short), _) => format!("\\fB\\-{short}\\fR"),
            (None, None, Some(_)) => String::new(),
            (None, None, None) => format!("\\fI{}\\fR", arg.get_id().as_str().to_uppercase()),
        };
        if let Some(v) = &value {
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(&format!("\\fI{}\\fR", roff_escape(v)));
        }
        if repeated {
            text.push_str("...");
        }
        if arg.is_required_set() {
            line.push_str(&format!(" {text}"));
        } else {
            line.push_str(&format!(" [{text}]"));
        }
    }
    line
}

/// `roff` minus its `.SH` heading lines: the body of one rendered section.
fn body_of(roff: &[u8]) -> String {
    let text = String::from_utf8_lossy(roff);
    let mut body = String::with_capacity(text.len());
    for line in text.lines().filter(|l| !l.starts_with(".SH ")) {
        body.push_str(line);
        body.push('\n');
    }
    body
}

/// The help texts' `code` spans in bold: each pair of backticks on a text line becomes
/// `\fB...\fR` (a line with an odd number of them is left alone).
fn code_spans(roff: &str) -> String {
    let mut out = String::with_capacity(roff.len());
    for line in roff.lines() {
        if line.starts_with('.') || line.matches('`').count() % 2 == 1 {
            out.push_str(line);
        } else {
            for (i, part) in line.split('`').enumerate() {
                if i > 0 {
                    out.push_str(if i % 2 == 1 { "\\fB" } else { "\\fR" });
                }
                out.push_str(part);
            }
        }
        out.push('\n');
    }
    out
}

/// Escapes `-` and `\` for roff, and a leading `.` or `'` that would start a request.
fn roff_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    if s.starts_with(['.', '\'']) {
        out.push_str("\\&");
    }
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\e"),
            '-' => out.push_str("\\-"),
            c => out.push(c),
        }
    }
    out
}
