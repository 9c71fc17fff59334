//! Directory listings (`browse = true`): a plain HTML page. Every name is HTML-escaped in the
//! text and percent-encoded in the link, so a file called `<script>` is shown, not run. Hidden
//! entries are left out unless the route allows them.

use std::fmt::Write;
use std::path::Path;

use super::path::{is_hidden, percent_encode};

/// Escapes text for HTML element content and attribute values.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Renders the listing of `dir`, shown at URL path `url_path` (ending with `/`). `None` when
/// the directory cannot be read.
pub fn render(dir: &Path, url_path: &str, allow_hidden: bool) -> Option<String> {
    let mut entries: Vec<(bool, String, u64)> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().into_string().ok()?;
            if !allow_hidden && is_hidden(&name) {
                return None;
            }
            // Follows symlinks for the kind and size shown; serving still applies the rules.
            let meta = std::fs::metadata(e.path()).ok();
            let is_dir = meta.as_ref().is_some_and(|m| m.is_dir());
            Some((is_dir, name, meta.map_or(0, |m| m.len())))
        })
        .collect();
    entries.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let title = html_escape(url_path);
    let mut html = format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Index of {title}</title></head>\n<body><h1>Index of {title}</h1>\n<ul>\n"
    );
    if url_path != "/" {
        html.push_str("<li><a href=\"../\">../</a></li>\n");
    }
    for (is_dir, name, size) in entries {
        let slash = if is_dir { "/" } else { "" };
        let _ = write!(
            html,
            "<li><a href=\"./{}{slash}\">{}{slash}</a>",
            html_escape(&percent_encode(&name)),
            html_escape(&name)
        );
        if !is_dir {
            let _ = write!(html, " {size}");
        }
        html.push_str("</li>\n");
    }
    html.push_str("</ul></body></html>\n");
    Some(html)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(
            html_escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(percent_encode("a b<c>.txt"), "a%20b%3Cc%3E.txt");
    }
}
