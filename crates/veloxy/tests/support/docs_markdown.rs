//! Just enough Markdown for the docs tests: fenced code blocks, inline links and the anchors
//! a page defines (mdBook's heading ids and explicit `id="..."` attributes).

use std::collections::{BTreeSet, HashMap};

/// A fenced code block.
#[derive(Debug)]
pub struct Block {
    /// The first word of the info string (`toml` for ```` ```toml,fragment ````).
    pub lang: String,
    /// The block's text.
    pub text: String,
    /// The 1-based line of the opening fence.
    pub line: usize,
    /// Marked as a fragment: `fragment` in the info string, or `<!-- fragment -->` before it.
    pub fragment: bool,
    /// Names from a `<!-- files: A B/ C+D -->` comment before the block.
    pub files: Vec<String>,
}

/// The fenced code blocks of a page, in order.
pub fn code_blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = fence(lines[i]) else {
            i += 1;
            continue;
        };
        let mut words = info
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|w| !w.is_empty());
        let lang = words.next().unwrap_or("").to_owned();
        let mut fragment = words.any(|w| w == "fragment");
        let mut files = Vec::new();
        // The HTML comments right above the fence (blank lines between are allowed).
        for above in lines[..i].iter().rev().map(|l| l.trim()) {
            if above.is_empty() {
                continue;
            }
            let Some(comment) = above
                .strip_prefix("<!--")
                .and_then(|c| c.strip_suffix("-->"))
            else {
                break;
            };
            let comment = comment.trim();
            if comment == "fragment" {
                fragment = true;
            } else if let Some(names) = comment.strip_prefix("files:") {
                files.extend(names.split_whitespace().map(str::to_owned));
            }
        }
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && fence(lines[i]).is_none() {
            body.push(lines[i]);
            i += 1;
        }
        i += 1;
        out.push(Block {
            lang,
            text: body.join("\n") + "\n",
            line: start + 1,
            fragment,
            files,
        });
    }
    out
}

/// The info string of a fence line (```` ``` ```` at the start, up to three spaces in).
fn fence(line: &str) -> Option<&str> {
    let trimmed = line.trim_start();
    (line.len() - trimmed.len() <= 3).then_some(())?;
    trimmed.strip_prefix("```").map(str::trim)
}

/// The lines of a page outside fenced code blocks, with their 1-based numbers and inline
/// code spans blanked out.
fn prose(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_fence = false;
    for (n, line) in text.lines().enumerate() {
        if fence(line).is_some() {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let mut kept = String::new();
        for (k, part) in line.split('`').enumerate() {
            if k % 2 == 0 {
                kept.push_str(part);
            } else {
                kept.push_str(&" ".repeat(part.len() + 2));
            }
        }
        out.push((n + 1, kept));
    }
    out
}

/// An inline link or image.
#[derive(Debug)]
pub struct Link {
    /// What is between the parentheses (a title after a space is left out).
    pub target: String,
    /// Its 1-based line.
    pub line: usize,
}

/// The inline links (`[text](target)`) and images of a page, outside code.
pub fn links_of(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for (line, prose) in prose(text) {
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            let target = target.trim_start_matches('<').trim_end_matches('>');
            if !target.is_empty() {
                out.push(Link {
                    target: target.to_owned(),
                    line,
                });
            }
            rest = &after[end..];
        }
    }
    out
}

/// The anchors a page defines.
#[derive(Debug, Default)]
pub struct Anchors {
    /// From `id="..."` attributes (`<a id="server.workers"></a>`).
    pub explicit: BTreeSet<String>,
    /// mdBook's heading ids.
    pub headings: BTreeSet<String>,
}

impl Anchors {
    /// Both kinds.
    pub fn all(&self) -> BTreeSet<String> {
        self.explicit.union(&self.headings).cloned().collect()
    }
}

/// The anchors of a page.
pub fn anchors_of(text: &str) -> Anchors {
    let mut anchors = Anchors::default();
    let mut counts: HashMap<String, usize> = HashMap::new();
    let mut in_fence = false;
    for line in text.lines() {
        if fence(line).is_some() {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("id=\"") {
            let after = &rest[at + 4..];
            let end = after.find('"').unwrap_or(after.len());
            anchors.explicit.insert(after[..end].to_owned());
            rest = &after[end..];
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let id = heading_id(&line[hashes..]);
            // mdBook numbers repeated ids: `id`, `id-1`, `id-2`, ...
            let n = counts.entry(id.clone()).or_insert(0);
            let unique = if *n == 0 {
                id.clone()
            } else {
                format!("{id}-{n}")
            };
            *n += 1;
            anchors.headings.insert(unique);
        }
    }
    anchors
}

/// mdBook's id for a heading: its text (markup and HTML tags removed), lowercase,
/// whitespace to `-`, keeping only alphanumerics, `_` and `-`.
fn heading_id(heading: &str) -> String {
    let mut text = String::new();
    let mut chars = heading.trim().chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '<' => {
                for c in chars.by_ref() {
                    if c == '>' {
                        break;
                    }
                }
            }
            // A link's target is not part of its text.
            ']' if chars.peek() == Some(&'(') => {
                for c in chars.by_ref() {
                    if c == ')' {
                        break;
                    }
                }
            }
            '`' | '*' | '[' | ']' => {}
            c => text.push(c),
        }
    }
    text.trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_ascii_lowercase())
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}
