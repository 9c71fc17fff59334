//! The access log: off by default; `[server.access_log] path = "access.log"` (or `"stdout"`),
//! `format = "combined"` (default) or `"json"`, `buffer = 8192` (lines).
//!
//! Workers format a line and hand it to a background writer thread through a bounded channel
//! without ever waiting: when the channel is full the line is dropped and counted in
//! `veloxy_access_log_dropped_total`, so a slow disk never slows requests. SIGUSR1 reopens the
//! file (for logrotate).

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Apache/nginx "combined".
    Combined,
    /// One JSON object per line.
    Json,
}

/// `[server.access_log]`, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLogConfig {
    /// A file path, or `None` for stdout.
    pub path: Option<PathBuf>,
    pub format: Format,
    /// Lines buffered between workers and the writer. Default 8192.
    pub buffer: usize,
}

/// What a worker records about one request.
pub struct Entry<'a> {
    pub client: SocketAddr,
    pub method: &'a str,
    pub target: &'a str,
    pub version: u8,
    pub status: u16,
    pub bytes_sent: u64,
    pub duration: Duration,
    pub referer: &'a [u8],
    pub user_agent: &'a [u8],
    pub upstream: &'a str,
    pub backend: Option<&'a crate::upstream::addr::BackendAddr>,
    /// `[server] request_id`: the request's ID (appended to combined lines as a quoted last
    /// field, a `request_id` member in JSON).
    pub request_id: Option<&'a str>,
    /// L4 streams: the bytes received from the client (`bytes_received` in JSON).
    pub bytes_received: Option<u64>,
    /// `[server.tracing]` is on: the trace and span ids of the exchange's span (empty when
    /// it was not sampled). Combined lines end with `"TRACE_ID" "SPAN_ID"` (`"-"` when
    /// empty), JSON has `trace_id` and `span_id` members.
    pub trace: Option<(&'a str, &'a str)>,
}

/// The workers' side of the log.
#[derive(Debug, Clone)]
pub struct AccessLog {
    tx: SyncSender<String>,
    format: Format,
    reopen: Arc<AtomicBool>,
}

impl AccessLog {
    /// Opens the log and starts the writer thread.
    pub fn start(config: &AccessLogConfig) -> std::io::Result<AccessLog> {
        let (tx, rx) = sync_channel(config.buffer.max(16));
        let reopen = Arc::new(AtomicBool::new(false));
        let sink = Sink::open(config.path.clone())?;
        let flag = reopen.clone();
        std::thread::Builder::new()
            .name("veloxy-access-log".into())
            .spawn(move || writer(rx, sink, flag))?;
        Ok(AccessLog {
            tx,
            format: config.format,
            reopen,
        })
    }

    /// Asks the writer to reopen the file before its next write.
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Relaxed);
    }

    /// Formats and queues one line; returns false if it had to be dropped.
    pub fn log(&self, e: &Entry) -> bool {
        let line = match self.format {
            Format::Combined => combined(e),
            Format::Json => json(e),
        };
        match self.tx.try_send(line) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
        }
    }
}

enum Sink {
    Stdout,
    File(PathBuf, std::io::BufWriter<std::fs::File>),
}

impl Sink {
    fn open(path: Option<PathBuf>) -> std::io::Result<Sink> {
        Ok(match path {
            None => Sink::Stdout,
            Some(p) => {
                let f = OpenOptions::new().create(true).append(true).open(&p)?;
                Sink::File(p, std::io::BufWriter::with_capacity(64 * 1024, f))
            }
        })
    }

    fn write(&mut self, line: &str) {
        let _ = match self {
            Sink::Stdout => std::io::stdout().lock().write_all(line.as_bytes()),
            Sink::File(_, w) => w.write_all(line.as_bytes()),
        };
    }

    fn flush(&mut self) {
        let _ = match self {
            Sink::Stdout => std::io::stdout().flush(),
            Sink::File(_, w) => w.flush(),
        };
    }
}

/// How often the writer drains the queue. It polls on a timer instead of blocking in `recv`:
/// a blocked receiver makes every `try_send` wake it (a futex syscall and a context switch
/// per line, measured at +80% CPU per request). With the queue's default 8192 lines, 10 ms
/// absorbs about 800k lines/s before anything is dropped.
const DRAIN_EVERY: Duration = Duration::from_millis(10);

fn writer(rx: Receiver<String>, mut sink: Sink, reopen: Arc<AtomicBool>) {
    loop {
        std::thread::sleep(DRAIN_EVERY);
        if reopen.swap(false, Ordering::Relaxed) {
            sink.flush();
            if let Sink::File(path, _) = &sink {
                match Sink::open(Some(path.clone())) {
                    Ok(s) => sink = s,
                    Err(e) => {
                        tracing::error!(error = %e, "access log: reopen failed; keeping the old file")
                    }
                }
            }
        }
        // Drain what is queued, then flush once: one write(2) per batch, not per line.
        let mut wrote = false;
        loop {
            match rx.try_recv() {
                Ok(line) => {
                    sink.write(&line);
                    wrote = true;
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    sink.flush();
                    return;
                }
            }
        }
        if wrote {
            sink.flush();
        }
    }
}

/// Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// (date-time parts) of now, UTC.
fn now_parts() -> (i64, u32, u32, u64, u64, u64, u32) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs();
    let (y, m, day) = civil((secs / 86_400) as i64);
    let t = secs % 86_400;
    (y, m, day, t / 3600, t / 60 % 60, t % 60, d.subsec_millis())
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Escapes bytes for a quoted log field: quotes, backslashes and control bytes.
fn quoted(out: &mut String, bytes: &[u8], json: bool) {
    for &b in bytes {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(b as char),
            _ if json => {
                let _ = write!(out, "\\u{b:04x}");
            }
            _ => {
                let _ = write!(out, "\\x{b:02X}");
            }
        }
    }
}

fn combined(e: &Entry) -> String {
    let (y, m, d, hh, mm, ss, _) = now_parts();
    let mut s = String::with_capacity(256);
    let _ = write!(
        s,
        "{} - - [{d:02}/{}/{y}:{hh:02}:{mm:02}:{ss:02} +0000] \"",
        e.client.ip(),
        MONTHS[(m - 1) as usize]
    );
    quoted(&mut s, e.method.as_bytes(), false);
    s.push(' ');
    quoted(&mut s, e.target.as_bytes(), false);
    let _ = write!(
        s,
        " {}\" {} {} \"",
        protocol(e.version),
        e.status,
        e.bytes_sent
    );
    quoted(
        &mut s,
        if e.referer.is_empty() {
            b"-"
        } else {
            e.referer
        },
        false,
    );
    s.push_str("\" \"");
    quoted(
        &mut s,
        if e.user_agent.is_empty() {
            b"-"
        } else {
            e.user_agent
        },
        false,
    );
    s.push('"');
    if let Some(id) = e.request_id {
        s.push_str(" \"");
        quoted(&mut s, id.as_bytes(), false);
        s.push('"');
    }
    if let Some((trace, span)) = e.trace {
        let _ = write!(s, " \"{}\" \"{}\"", or_dash(trace), or_dash(span));
    }
    s.push('\n');
    s
}

fn or_dash(v: &str) -> &str {
    if v.is_empty() {
        "-"
    } else {
        v
    }
}

fn json(e: &Entry) -> String {
    let (y, m, d, hh, mm, ss, ms) = now_parts();
    let mut s = String::with_capacity(320);
    let _ = write!(
        s,
        "{{\"time\":\"{y}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}.{ms:03}Z\",\"client\":\"{}\",\"method\":\"",
        e.client.ip()
    );
    quoted(&mut s, e.method.as_bytes(), true);
    s.push_str("\",\"target\":\"");
    quoted(&mut s, e.target.as_bytes(), true);
    let _ = write!(
        s,
        "\",\"protocol\":\"{}\",\"status\":{},\"bytes_sent\":{},\"duration_ms\":{:.3},\"upstream\":\"",
        protocol(e.version),
        e.status,
        e.bytes_sent,
        e.duration.as_secs_f64() * 1000.0
    );
    quoted(&mut s, e.upstream.as_bytes(), true);
    s.push_str("\",\"backend\":");
    match e.backend {
        Some(b) => {
            let _ = write!(s, "\"{b}\"");
        }
        None => s.push_str("null"),
    }
    s.push_str(",\"referer\":\"");
    quoted(&mut s, e.referer, true);
    s.push_str("\",\"user_agent\":\"");
    quoted(&mut s, e.user_agent, true);
    if let Some(id) = e.request_id {
        s.push_str("\",\"request_id\":\"");
        quoted(&mut s, id.as_bytes(), true);
    }
    s.push('"');
    if let Some((trace, span)) = e.trace {
        // Hex digits: nothing to escape.
        let _ = write!(s, ",\"trace_id\":\"{trace}\",\"span_id\":\"{span}\"");
    }
    if let Some(n) = e.bytes_received {
        let _ = write!(s, ",\"bytes_received\":{n}");
    }
    s.push_str("}\n");
    s
}

/// The protocol name for an entry's version: 0 and 1 are HTTP/1.x, 2 is HTTP/2, 3 HTTP/3.
fn protocol(version: u8) -> &'static str {
    match version {
        0 => "HTTP/1.0",
        1 => "HTTP/1.1",
        STREAM => "TCP",
        3 => "HTTP/3",
        _ => "HTTP/2.0",
    }
}

/// The `version` of an L4 stream's entry (its protocol is logged as `TCP`).
pub(crate) const STREAM: u8 = 255;

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry<'static> {
        static BACKEND: std::sync::LazyLock<crate::upstream::addr::BackendAddr> =
            std::sync::LazyLock::new(|| "127.0.0.1:9001".parse().unwrap());
        Entry {
            client: "10.1.2.3:5555".parse().unwrap(),
            method: "GET",
            target: "/a?b=\"c\"",
            version: 1,
            status: 200,
            bytes_sent: 123,
            duration: Duration::from_micros(1500),
            referer: b"",
            user_agent: b"curl/8\x01",
            upstream: "app",
            backend: Some(&BACKEND),
            request_id: None,
            trace: None,
            bytes_received: None,
        }
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_723), (2024, 1, 1));
        assert_eq!(civil(11_016), (2000, 2, 29));
    }

    #[test]
    fn combined_line() {
        let l = combined(&entry());
        assert!(l.starts_with("10.1.2.3 - - ["), "{l}");
        assert!(
            l.ends_with("] \"GET /a?b=\\\"c\\\" HTTP/1.1\" 200 123 \"-\" \"curl/8\\x01\"\n"),
            "{l}"
        );
    }

    #[test]
    fn json_line() {
        let l = json(&entry());
        assert!(
            l.contains("\"status\":200,\"bytes_sent\":123,\"duration_ms\":1.500"),
            "{l}"
        );
        assert!(l.contains("\"target\":\"/a?b=\\\"c\\\"\""), "{l}");
        assert!(l.contains("\"user_agent\":\"curl/8\\u0001\""), "{l}");
    }
}
