//! Content types by file extension: a small built-in table of what websites actually serve.
//! Text types carry `charset=utf-8` (what build tools emit; without it browsers guess).
//! Unknown extensions are `application/octet-stream`, which browsers download rather than
//! render, the safe default for a file of unknown kind.

/// The `Content-Type` for a file name.
pub fn content_type(name: &str) -> &'static str {
    let ext = match name.rsplit_once('.') {
        Some((_, e)) if !e.contains('/') => e,
        _ => return "application/octet-stream",
    };
    let mut lower = [0u8; 16];
    if ext.len() > lower.len() {
        return "application/octet-stream";
    }
    for (d, s) in lower.iter_mut().zip(ext.bytes()) {
        *d = s.to_ascii_lowercase();
    }
    match &lower[..ext.len()] {
        b"html" | b"htm" => "text/html; charset=utf-8",
        b"css" => "text/css; charset=utf-8",
        b"js" | b"mjs" | b"cjs" => "text/javascript; charset=utf-8",
        b"json" | b"map" => "application/json",
        b"webmanifest" => "application/manifest+json",
        b"txt" | b"text" | b"log" => "text/plain; charset=utf-8",
        b"md" | b"markdown" => "text/markdown; charset=utf-8",
        b"csv" => "text/csv; charset=utf-8",
        b"xml" => "application/xml",
        b"rss" => "application/rss+xml",
        b"atom" => "application/atom+xml",
        b"xhtml" => "application/xhtml+xml",
        b"svg" | b"svgz" => "image/svg+xml",
        b"wasm" => "application/wasm",
        b"png" => "image/png",
        b"jpg" | b"jpeg" => "image/jpeg",
        b"gif" => "image/gif",
        b"webp" => "image/webp",
        b"avif" => "image/avif",
        b"ico" => "image/x-icon",
        b"bmp" => "image/bmp",
        b"woff" => "font/woff",
        b"woff2" => "font/woff2",
        b"ttf" => "font/ttf",
        b"otf" => "font/otf",
        b"eot" => "application/vnd.ms-fontobject",
        b"mp4" => "video/mp4",
        b"webm" => "video/webm",
        b"mp3" => "audio/mpeg",
        b"ogg" => "audio/ogg",
        b"wav" => "audio/wav",
        b"pdf" => "application/pdf",
        b"zip" => "application/zip",
        b"gz" => "application/gzip",
        b"tar" => "application/x-tar",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::content_type;

    #[test]
    fn by_extension() {
        assert_eq!(content_type("/a/index.HTML"), "text/html; charset=utf-8");
        assert_eq!(content_type("app.min.js"), "text/javascript; charset=utf-8");
        assert_eq!(content_type("logo.svg"), "image/svg+xml");
        assert_eq!(content_type("README"), "application/octet-stream");
        assert_eq!(
            content_type("a.averyverylongext"),
            "application/octet-stream"
        );
        assert_eq!(content_type("/dir.d/file"), "application/octet-stream");
    }
}
