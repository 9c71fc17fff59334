//! pacer: an open-loop, fixed-rate HTTP/1.1 keep-alive load generator for the sweep's ramp.
//!
//! Why hand-written: the ramp asks what p99 a proxy gives at 25-90% of its ceiling, and on a
//! 2-core machine the generator shares its core with the four upstreams. oha (a tokio task
//! per connection) filled that core from about half of the ceilings up, so its p99 there was
//! its own queue, not the proxy's. wrk2, the usual answer, is not packaged here. pacer is what
//! wrk is for closed loops: one thread, one epoll instance, one `write` and about one `read`
//! per request, and no allocation on the request path.
//!
//! The schedule: request k is due at `start + k / rate`, whatever happened before (an open
//! model). A due request goes out on an idle connection; when none is idle it waits for one,
//! and its latency still counts from when it was due (the coordinated-omission correction of
//! wrk2 and `oha --latency-correction`). Due requests never sent by the end count with the
//! time they had waited, a lower bound. The generator's own lateness is reported beside
//! (`send_lag_ms`, and `cpu_busy`, its CPU time over the run's wall time): when it is high,
//! the figures describe pacer, not the server.
//!
//! Timers: `epoll_pwait2` takes a nanosecond timeout and the thread's timer slack is set to
//! 1 ns, so an idle generator wakes within microseconds of a due time instead of rounding up
//! to the next millisecond (which `epoll_wait` would, adding up to 1 ms to every latency).
//!
//! Hosts: `-H FILE` names a file with one `Host` value a line; request k carries line
//! k mod n (formatted once at start), so the load spreads evenly over many virtual hosts
//! (`bench/kube_load.py`: 1,000 Ingress hosts). Without it every request carries the URL's.
//!
//! Phases: `-P K -W SECS [-G SECS]` cuts the measured window into windows of `-W` seconds that
//! take K phases in turn (window n is phase n mod K), and keeps one latency histogram per
//! phase beside the whole run's, leaving out of them the first `-G` seconds of every window
//! (a guard: the previous window's work may still be settling). A request counts in the phase
//! of the window it was due in. A caller that changes something on the same schedule (issue
//! 37: EndpointSlice churn on in phase 1, off in phase 0) compares the phases' latencies,
//! interleaved seconds apart, so that the VM's slow drift falls on every phase alike. At the
//! start, pacer writes `measure_from_monotonic SECS` on stderr: CLOCK_MONOTONIC (Python's
//! `time.monotonic()`) of the measured window's start, for the caller's schedule. The JSON
//! gains `phases`: per phase, its latency, requests and failures, and each window's p99.
//!
//! Output: one JSON object on stdout. Usage:
//! `pacer http://127.0.0.1:8080/path -c 64 -r 20000 -d 5 [-w 1] [-t 2] [-H HOSTS_FILE]
//! [-P PHASES -W WINDOW_SECS [-G GUARD_SECS]]`

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

mod conn;
use conn::{Conn, Event};

struct Args {
    addr: SocketAddr,
    /// The requests, formatted once: one per `-H` host (one with the URL's host without).
    requests: Vec<Vec<u8>>,
    connections: usize,
    rate: f64,
    duration: Duration,
    warmup: Duration,
    timeout: Duration,
    /// Sends are batched to wake-ups at least this far apart.
    quantum: Duration,
    /// `-P`, `-W`, `-G`: phases taken in turn by windows of the measured time.
    phases: Option<Phases>,
}

/// The measured window cut into windows that take `count` phases in turn.
#[derive(Clone, Copy)]
struct Phases {
    count: usize,
    window: Duration,
    guard: Duration,
}

impl Phases {
    /// (window number, phase) of a request due `since` after the measured window began; None
    /// inside a window's guard.
    fn of(&self, since: Duration) -> Option<(usize, usize)> {
        let w = self.window.as_secs_f64();
        let n = (since.as_secs_f64() / w).floor() as usize;
        let into = since.as_secs_f64() - n as f64 * w;
        (into >= self.guard.as_secs_f64()).then_some((n, n % self.count))
    }
}

fn usage(why: &str) -> ! {
    eprintln!("pacer: {why}\nusage: pacer http://HOST:PORT/PATH -c CONNS -r RATE -d SECS [-w WARMUP_SECS] [-t TIMEOUT_SECS] [-H HOSTS_FILE] [-P PHASES -W WINDOW_SECS [-G GUARD_SECS]]");
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut url = None;
    let (mut c, mut r, mut d, mut w, mut t) = (64usize, None, 5.0f64, 1.0f64, 2.0f64);
    let mut q = 100.0f64;
    let (mut phases, mut window, mut guard) = (0usize, None, 0.0f64);
    let mut hosts_file = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if a == "-H" {
            hosts_file = Some(it.next().unwrap_or_else(|| usage("-H wants a file")));
            continue;
        }
        let mut val = |name: &str| -> f64 {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage(&format!("{name} wants a number")))
        };
        match a.as_str() {
            "-c" => c = val("-c") as usize,
            "-r" => r = Some(val("-r")),
            "-d" => d = val("-d"),
            "-w" => w = val("-w"),
            "-t" => t = val("-t"),
            "-q" => q = val("-q"),
            "-P" => phases = val("-P") as usize,
            "-W" => window = Some(val("-W")),
            "-G" => guard = val("-G"),
            _ if a.starts_with("http://") => url = Some(a),
            _ => usage(&format!("unknown argument {a:?}")),
        }
    }
    let url = url.unwrap_or_else(|| usage("no http:// URL"));
    let rate = r.unwrap_or_else(|| usage("no rate (-r)"));
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if c == 0 || !positive(rate) || !positive(d) || w < 0.0 || !positive(t) {
        usage("connections, rate, duration and timeout must be positive");
    }
    let phases = match (phases, window) {
        (0, None) => None,
        (k, Some(w)) if k > 0 && positive(w) && (0.0..w).contains(&guard) => Some(Phases {
            count: k,
            window: Duration::from_secs_f64(w),
            guard: Duration::from_secs_f64(guard),
        }),
        _ => usage("-P and -W go together: a phase count and a window, the guard (-G) below it"),
    };
    let rest = &url["http://".len()..];
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let addr = host
        .parse()
        .unwrap_or_else(|_| usage("the URL's host must be IP:PORT"));
    let hosts: Vec<String> = match hosts_file {
        None => vec![host.to_string()],
        Some(f) => std::fs::read_to_string(&f)
            .unwrap_or_else(|e| usage(&format!("cannot read {f}: {e}")))
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect(),
    };
    if hosts.is_empty() {
        usage("the -H file names no host");
    }
    let requests = hosts
        .iter()
        .map(|h| format!("GET {path} HTTP/1.1\r\nHost: {h}\r\n\r\n").into_bytes())
        .collect();
    Args {
        addr,
        requests,
        connections: c,
        rate,
        duration: Duration::from_secs_f64(d),
        warmup: Duration::from_secs_f64(w),
        timeout: Duration::from_secs_f64(t),
        quantum: Duration::from_secs_f64(q.max(0.0) / 1e6),
        phases,
    }
}

/// Counts over the measured window (after the warmup).
#[derive(Default)]
struct Tally {
    ok: u64,
    non2xx: u64,
    connect: u64,
    read: u64,
    timeout: u64,
}

struct Recorder {
    measure_from: Instant,
    corrected: Histogram<u64>,
    raw: Histogram<u64>,
    lag: Histogram<u64>,
    tally: Tally,
    phases: Option<Phases>,
    /// Per phase: its corrected latencies, answers and failures.
    by_phase: Vec<PhaseTally>,
    /// Per window (phase `n % count`): its corrected latencies.
    windows: Vec<Histogram<u64>>,
}

#[derive(Default)]
struct PhaseTally {
    corrected: Option<Histogram<u64>>,
    answered: u64,
    non2xx: u64,
    failed: u64,
}

impl Recorder {
    fn counts(&self, due: Instant) -> bool {
        due >= self.measure_from
    }
    /// The (window, phase) a request due at `due` counts in, if any.
    fn phase(&self, due: Instant) -> Option<(usize, usize)> {
        self.phases?
            .of(due.checked_duration_since(self.measure_from)?)
    }
    /// A corrected latency into the whole run's histogram and its phase's and window's.
    fn latency(&mut self, due: Instant, latency: u64) {
        let _ = self.corrected.record(latency);
        if let Some((n, p)) = self.phase(due) {
            if self.windows.len() <= n {
                self.windows.resize_with(n + 1, histogram);
            }
            let _ = self.windows[n].record(latency);
            let _ = self.by_phase[p]
                .corrected
                .get_or_insert_with(histogram)
                .record(latency);
        }
    }
    fn failed(&mut self, due: Instant) {
        if let Some((_, p)) = self.phase(due) {
            self.by_phase[p].failed += 1;
        }
    }
    fn done(&mut self, due: Instant, sent: Instant, now: Instant, status: u16) {
        if !self.counts(due) {
            return;
        }
        let start = due.min(sent); // late: from when due (the correction); early: from the send
        self.latency(due, us(now - start));
        if let Some((_, p)) = self.phase(due) {
            let t = &mut self.by_phase[p];
            t.answered += 1;
            t.non2xx += u64::from(!(200..300).contains(&status));
        }
        let _ = self.raw.record(us(now - sent));
        let _ = self.lag.record(us(sent.saturating_duration_since(due)));
        if (200..300).contains(&status) {
            self.tally.ok += 1;
        } else {
            self.tally.non2xx += 1;
        }
    }
}

fn us(d: Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

struct Poller {
    fd: i32,
    events: Vec<libc::epoll_event>,
}

impl Poller {
    fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let events = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
        Ok(Self { fd, events })
    }
    fn add(&self, fd: i32, token: usize) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
            u64: token as u64,
        };
        // SAFETY: `ev` outlives the call; the result is checked.
        if unsafe { libc::epoll_ctl(self.fd, libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
    /// Ready tokens, waiting at most `timeout` (nanosecond precision).
    fn wait(&mut self, timeout: Duration) -> io::Result<&[libc::epoll_event]> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: the events buffer and timespec outlive the call; the result is checked.
        let n = unsafe {
            libc::syscall(
                libc::SYS_epoll_pwait2,
                self.fd,
                self.events.as_mut_ptr(),
                self.events.len() as libc::c_int,
                &ts as *const libc::timespec,
                std::ptr::null::<libc::sigset_t>(),
                0usize,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(&[])
            } else {
                Err(e)
            };
        }
        Ok(&self.events[..n as usize])
    }
}

fn open(args: &Args, poller: &Poller, token: usize) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&args.addr, args.timeout)?;
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    poller.add(s.as_raw_fd(), token)?;
    Ok(s)
}

fn main() {
    let args = parse_args();
    // SAFETY: prctl with plain integer arguments. A 1 ns slack makes the nanosecond timeout
    // of epoll_pwait2 mean what it says (the default slack is 50 us).
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) };
    let mut poller = Poller::new().unwrap_or_else(|e| usage(&format!("epoll: {e}")));
    let mut conns: Vec<Conn> = Vec::with_capacity(args.connections);
    let mut idle: std::collections::VecDeque<usize> = Default::default();
    for i in 0..args.connections {
        match open(&args, &poller, i) {
            Ok(s) => {
                conns.push(Conn::new(Some(s)));
                idle.push_back(i);
            }
            Err(e) => usage(&format!("cannot connect to {}: {e}", args.addr)),
        }
    }
    let interval = 1.0 / args.rate;
    let start = Instant::now();
    let cpu0 = cpu_seconds();
    let measure_from = start + args.warmup;
    let end = measure_from + args.duration;
    if args.phases.is_some() {
        // SAFETY: clock_gettime fills the timespec it is given.
        let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let from = ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9 + args.warmup.as_secs_f64()
            - start.elapsed().as_secs_f64();
        eprintln!("measure_from_monotonic {from:.6}");
    }
    let mut rec = Recorder {
        measure_from,
        corrected: histogram(),
        raw: histogram(),
        lag: histogram(),
        tally: Tally::default(),
        phases: args.phases,
        by_phase: (0..args.phases.map_or(0, |p| p.count))
            .map(|_| PhaseTally::default())
            .collect(),
        windows: Vec::new(),
    };
    let due_at = |k: u64| start + Duration::from_secs_f64(k as f64 * interval);
    let mut next: u64 = 0;
    let mut next_sweep = start;
    let mut dead: Vec<usize> = Vec::new();
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        // Every due request that has a connection goes out now.
        // Due within the quantum counts as due: one wake-up sends a small batch, early by
        // less than the quantum (those count from when they were sent).
        while due_at(next) <= now + args.quantum {
            let Some(i) = idle.pop_front() else { break };
            if !conns[i].ready() {
                continue; // closed while queued (reopened later) or queued twice
            }
            let request = &args.requests[(next % args.requests.len() as u64) as usize];
            match conns[i].send(request, due_at(next), now) {
                Ok(()) => next += 1,
                // `send` marked the request in flight first: `fail` counts it.
                Err(_) => fail(&mut conns[i], &mut rec, &mut dead, i, false),
            }
        }
        if now >= next_sweep {
            next_sweep = now + Duration::from_millis(10);
            sweep(
                &args, &poller, &mut conns, &mut idle, &mut dead, &mut rec, now,
            );
        }
        let wake = if idle.is_empty() {
            next_sweep
        } else {
            due_at(next).max(now + args.quantum).min(next_sweep)
        };
        let timeout = wake.min(end).saturating_duration_since(now);
        let ready: Vec<(usize, u32)> = match poller.wait(timeout) {
            Ok(evs) => evs.iter().map(|e| (e.u64 as usize, e.events)).collect(),
            Err(e) => usage(&format!("epoll_pwait2: {e}")),
        };
        let now = Instant::now();
        for (i, bits) in ready {
            let readable = libc::EPOLLIN | libc::EPOLLERR | libc::EPOLLHUP | libc::EPOLLRDHUP;
            let event = if bits & readable as u32 != 0 {
                conns[i].on_readable()
            } else {
                Event::Nothing
            };
            match event {
                Event::Nothing => {
                    if bits & libc::EPOLLOUT as u32 != 0 && conns[i].flush().is_err() {
                        fail(&mut conns[i], &mut rec, &mut dead, i, false);
                    }
                }
                Event::Done { due, sent, status } => {
                    rec.done(due, sent, now, status);
                    idle.push_back(i);
                }
                Event::Failed => fail(&mut conns[i], &mut rec, &mut dead, i, false),
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    // Due but never sent: they waited at least until the end.
    let mut unsent = 0u64;
    while due_at(next) < end {
        let due = due_at(next);
        if due >= measure_from {
            rec.latency(due, us(end - due));
            unsent += 1;
        }
        next += 1;
    }
    print_json(&args, &rec, unsent, cpu / wall);
}

/// Requests past the timeout fail; closed connections reopen.
fn sweep(
    args: &Args,
    poller: &Poller,
    conns: &mut [Conn],
    idle: &mut std::collections::VecDeque<usize>,
    dead: &mut Vec<usize>,
    rec: &mut Recorder,
    now: Instant,
) {
    for (i, c) in conns.iter_mut().enumerate() {
        if c.overdue(now, args.timeout) {
            fail(c, rec, dead, i, true);
        }
    }
    let mut still = Vec::new();
    for i in dead.drain(..) {
        match open(args, poller, i) {
            Ok(s) => {
                conns[i] = Conn::new(Some(s));
                idle.push_back(i);
            }
            Err(_) => {
                rec.tally.connect += u64::from(now >= rec.measure_from);
                still.push(i);
            }
        }
    }
    *dead = still;
}

fn fail(c: &mut Conn, rec: &mut Recorder, dead: &mut Vec<usize>, i: usize, timed_out: bool) {
    if let Some(due) = c.in_flight() {
        if rec.counts(due) {
            rec.failed(due);
            if timed_out {
                rec.tally.timeout += 1;
            } else {
                rec.tally.read += 1;
            }
        }
    }
    c.close();
    dead.push(i);
}

fn pcts(h: &Histogram<u64>) -> String {
    let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    if h.is_empty() {
        return "null".into();
    }
    format!(
        "{{\"p50\": {}, \"p75\": {}, \"p90\": {}, \"p99\": {}, \"p99.9\": {}, \"p99.99\": {}, \"max\": {}, \"mean\": {:.3}}}",
        q(0.5),
        q(0.75),
        q(0.9),
        q(0.99),
        q(0.999),
        q(0.9999),
        h.max() as f64 / 1000.0,
        h.mean() / 1000.0
    )
}

/// The phases' figures (`null` without `-P`): per phase its latency, answers, non-2xx and
/// failures; and each window's p99 (ms, null for a window with no request), in window order.
fn phases_json(rec: &Recorder) -> String {
    let Some(ph) = rec.phases else {
        return "null".into();
    };
    let per: Vec<String> = (rec.by_phase.iter())
        .map(|t| {
            let lat = t.corrected.as_ref().map_or("null".into(), pcts);
            format!(
                "{{\"latency_ms\": {lat}, \"answered\": {}, \"non2xx\": {}, \"failed\": {}}}",
                t.answered, t.non2xx, t.failed
            )
        })
        .collect();
    let windows: Vec<String> = (rec.windows.iter())
        .map(|h| match h.is_empty() {
            true => "null".into(),
            false => format!("{}", h.value_at_quantile(0.99) as f64 / 1000.0),
        })
        .collect();
    format!(
        "{{\"count\": {}, \"window_s\": {}, \"guard_s\": {}, \"per_phase\": [{}], \"window_p99_ms\": [{}]}}",
        ph.count,
        ph.window.as_secs_f64(),
        ph.guard.as_secs_f64(),
        per.join(", "),
        windows.join(", ")
    )
}

fn print_json(args: &Args, rec: &Recorder, unsent: u64, cpu_busy: f64) {
    let t = &rec.tally;
    let secs = args.duration.as_secs_f64();
    let responses = t.ok + t.non2xx;
    let out = format!(
        "{{\"tool\": \"pacer\", \"offered_rps\": {}, \"connections\": {}, \"duration_s\": {secs}, \
         \"requests\": {}, \"rps\": {:.1}, \"ok\": {}, \"non2xx\": {}, \
         \"errors\": {{\"connect\": {}, \"read\": {}, \"timeout\": {}}}, \"unsent_at_end\": {unsent}, \
         \"cpu_busy\": {cpu_busy:.3}, \"latency_ms\": {}, \"uncorrected_latency_ms\": {}, \
         \"send_lag_ms\": {}, \"phases\": {}}}",
        args.rate,
        args.connections,
        responses + t.read + t.timeout,
        responses as f64 / secs,
        t.ok,
        t.non2xx,
        t.connect,
        t.read,
        t.timeout,
        pcts(&rec.corrected),
        pcts(&rec.raw),
        pcts(&rec.lag),
        phases_json(rec),
    );
    let mut stdout = io::stdout().lock();
    let _ = writeln!(stdout, "{out}");
    let _ = stdout.flush();
}
