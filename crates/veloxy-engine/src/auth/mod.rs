//! `basic_auth`: HTTP Basic authentication against an htpasswd file.
//!
//! Entries are bcrypt (`$2y$`, `$2b$`, `$2a$`: `htpasswd -B`) or Apache's MD5 (`$apr1$`, weak:
//! a warning at load). A bcrypt check costs milliseconds by design, so a client that has
//! passed is remembered: each worker keeps the keyed hash of (file, user, password) for
//! [`CACHE_TTL`], and later requests with the same credentials cost a hash and a lookup.
//! Checks that miss that cache are rate limited per client address ([`FAILED_PER_MINUTE`]),
//! so the route cannot be used to burn the CPU: over it, 429 without checking. What passes
//! that limit is not checked on the worker: it becomes a [`Verify`] job for the process-wide
//! pool in [`verify`], itself bounded in threads, queue and checks per second.
//!
//! An unknown user costs the same as a known one: the password is checked against a dummy
//! hash of the file's bcrypt cost, so timing does not tell which user names exist.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;

use crate::limits::{RateKey, RateLimiter};

pub mod verify;
pub use verify::{Failed, Verify};

/// How long a verified credential is remembered (per worker).
pub const CACHE_TTL: Duration = Duration::from_secs(300);
/// Verified credentials remembered per worker; past this the cache starts over.
const CACHE_MAX: usize = 10_000;
/// Checks of unremembered credentials allowed per client address and minute.
pub const FAILED_PER_MINUTE: u32 = 20;

/// One user's password hash.
#[derive(Debug, Clone)]
enum Hash {
    Bcrypt(String),
    Apr1 { salt: String, full: String },
}

/// A route's `basic_auth`, compiled.
#[derive(Debug)]
pub struct BasicAuth {
    /// The realm named in `WWW-Authenticate`.
    pub realm: String,
    /// The users file, for `veloxy check --print`.
    pub file: String,
    users: HashMap<String, Hash>,
    /// Checked for an unknown user, so that it costs what a known user's check costs.
    dummy: Hash,
    attempts: Arc<RateLimiter>,
}

/// Why a request did not pass.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No or wrong credentials: 401 with a challenge.
    Challenge,
    /// Too many unremembered checks from this client: 429.
    TooMany,
}

/// What the synchronous part of a check decided.
pub enum Checked {
    /// Remembered credentials: pass.
    Pass,
    /// Refused without a hash computed.
    Refused(Refusal),
    /// The password must be checked against its hash, off the worker ([`Verify::run`]).
    Verify(Box<Verify>),
}

impl Hash {
    /// Whether `password` matches.
    fn matches(&self, password: &str) -> bool {
        match self {
            Hash::Bcrypt(h) => bcrypt::verify(password, h).unwrap_or(false),
            Hash::Apr1 { salt, full } => constant_time_eq(
                apr1(password.as_bytes(), salt.as_bytes()).as_bytes(),
                full.as_bytes(),
            ),
        }
    }

    /// A hash no password matches that costs what checking the file's users costs: bcrypt at
    /// the highest cost in the file, else `$apr1$`. A well-formed bcrypt string of that cost
    /// (fixed salt and digest, not computed: loading the file hashes nothing).
    fn dummy_for<'a>(users: impl Iterator<Item = &'a Hash>) -> Hash {
        let cost = users
            .filter_map(|h| match h {
                Hash::Bcrypt(s) => s.get(4..6)?.parse::<u32>().ok(),
                Hash::Apr1 { .. } => None,
            })
            .max();
        match cost {
            Some(c) => Hash::Bcrypt(format!(
                "$2b${c:02}$C6UzMDM.H6dfI/f/IKxGhuvGcJ6p0uEkdWO3vsm2vEAoC1FKb0pV."
            )),
            None => Hash::Apr1 {
                salt: "veloxy00".into(),
                full: "$apr1$veloxy00$................dummy.".into(),
            },
        }
    }
}

impl BasicAuth {
    /// Parses htpasswd `text`; returns the auth and the names of users with weak (`$apr1$`)
    /// hashes. Other hash kinds are refused with the user's name.
    pub fn parse(realm: &str, file: &str, text: &str) -> Result<(BasicAuth, Vec<String>), String> {
        let mut users = HashMap::new();
        let mut weak = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (user, hash) = line
                .split_once(':')
                .ok_or_else(|| format!("line {}: expected user:hash", n + 1))?;
            let hash = if hash.starts_with("$2y$")
                || hash.starts_with("$2b$")
                || hash.starts_with("$2a$")
            {
                Hash::Bcrypt(hash.to_owned())
            } else if let Some(rest) = hash.strip_prefix("$apr1$") {
                let salt = rest.split('$').next().unwrap_or("").to_owned();
                weak.push(user.to_owned());
                Hash::Apr1 {
                    salt,
                    full: hash.to_owned(),
                }
            } else {
                return Err(format!(
                    "line {}: user {user:?} has an unsupported hash: use bcrypt (htpasswd -B) or $apr1$",
                    n + 1
                ));
            };
            users.insert(user.to_owned(), hash);
        }
        if users.is_empty() {
            return Err("no users".to_owned());
        }
        let attempts = Arc::new(RateLimiter::new(
            f64::from(FAILED_PER_MINUTE) / 60.0,
            FAILED_PER_MINUTE,
            RateKey::ClientIp,
            100_000,
        ));
        let auth = BasicAuth {
            realm: realm.to_owned(),
            file: file.to_owned(),
            dummy: Hash::dummy_for(users.values()),
            users,
            attempts,
        };
        Ok((auth, weak))
    }

    /// Checks a request's `Authorization` value for the client at `client_ip`: remembered
    /// credentials pass at once; others, within the client's limit, need a [`Verify`] run.
    pub fn check(&self, authorization: Option<&[u8]>, client_ip: &str) -> Checked {
        let Some(raw) = authorization else {
            return Checked::Refused(Refusal::Challenge);
        };
        // Remembered by the field as sent: a hit costs one keyed hash and a lookup, no
        // decoding.
        let key = cache_key(self, raw);
        if remembered(key) {
            return Checked::Pass;
        }
        let Some((user, password)) = decode(raw) else {
            return Checked::Refused(Refusal::Challenge);
        };
        let ip_key = std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default()
            .hash_one(client_ip);
        if self.attempts.check(ip_key).is_err() {
            return Checked::Refused(Refusal::TooMany);
        }
        let hash = self.users.get(&user).unwrap_or(&self.dummy).clone();
        Checked::Verify(Box::new(Verify {
            key,
            password,
            hash,
            realm: self.realm.clone(),
        }))
    }

    /// The users' names, sorted (for tests and `--print`).
    pub fn users(&self) -> Vec<&str> {
        let mut u: Vec<&str> = self.users.keys().map(String::as_str).collect();
        u.sort_unstable();
        u
    }
}

/// `Basic base64(user:password)` -> (user, password).
fn decode(v: &[u8]) -> Option<(String, String)> {
    let v = std::str::from_utf8(v).ok()?.trim();
    let (scheme, data) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_owned(), p.to_owned()))
}

/// The keys are already keyed hashes: the map uses them as they are.
#[derive(Default)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Verified = HashMap<u64, u64, std::hash::BuildHasherDefault<KeyHasher>>;

thread_local! {
    /// Keyed hashes of verified credentials, with when they were verified (microseconds).
    static VERIFIED: RefCell<(std::hash::RandomState, Verified)> =
        RefCell::new((std::hash::RandomState::new(), Verified::default()));
}

/// A keyed hash (a per-thread random key) of the file and the field as sent: the cache never
/// holds a password.
fn cache_key(auth: &BasicAuth, raw: &[u8]) -> u64 {
    let id = auth as *const BasicAuth as usize;
    VERIFIED.with(|v| v.borrow().0.hash_one((id, raw)))
}

fn remembered(key: u64) -> bool {
    let ttl = CACHE_TTL.as_micros() as u64;
    VERIFIED.with(|v| {
        v.borrow()
            .1
            .get(&key)
            .is_some_and(|&t| crate::clock::now_us().saturating_sub(t) < ttl)
    })
}

fn remember(key: u64) {
    VERIFIED.with(|v| {
        let mut v = v.borrow_mut();
        if v.1.len() >= CACHE_MAX {
            v.1.clear();
        }
        v.1.insert(key, crate::clock::now_us());
    });
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Apache's `$apr1$` MD5 crypt (the md5-crypt algorithm with the `$apr1$` magic), as
/// `$apr1$SALT$HASH`. Hand-written: no maintained crate implements it without pulling an
/// unmaintained crypto stack; it is MD5 (from RustCrypto's `md-5`) in a fixed schedule.
fn apr1(password: &[u8], salt: &[u8]) -> String {
    use md5::{Digest, Md5};
    let salt = &salt[..salt.len().min(8)];
    let magic = b"$apr1$";
    let alt = Md5::new()
        .chain_update(password)
        .chain_update(salt)
        .chain_update(password)
        .finalize();
    let mut ctx = Md5::new()
        .chain_update(password)
        .chain_update(magic)
        .chain_update(salt);
    let mut left = password.len();
    while left > 0 {
        let n = left.min(16);
        ctx.update(&alt[..n]);
        left -= n;
    }
    let mut i = password.len();
    while i > 0 {
        if i & 1 != 0 {
            ctx.update([0u8]);
        } else {
            ctx.update(&password[..1]);
        }
        i >>= 1;
    }
    let mut fin = ctx.finalize();
    for round in 0..1000 {
        let mut c = Md5::new();
        if round & 1 != 0 {
            c.update(password);
        } else {
            c.update(fin);
        }
        if round % 3 != 0 {
            c.update(salt);
        }
        if round % 7 != 0 {
            c.update(password);
        }
        if round & 1 != 0 {
            c.update(fin);
        } else {
            c.update(password);
        }
        fin = c.finalize();
    }
    const ITOA64: &[u8] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut out = String::from("$apr1$");
    out.push_str(std::str::from_utf8(salt).unwrap_or(""));
    out.push('$');
    let mut put = |mut v: u32, n: usize| {
        for _ in 0..n {
            out.push(ITOA64[(v & 0x3f) as usize] as char);
            v >>= 6;
        }
    };
    let f = |i: usize| u32::from(fin[i]);
    for (a, b, c) in [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)] {
        put((f(a) << 16) | (f(b) << 8) | f(c), 4);
    }
    put(f(11), 2);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apr1_matches_apache() {
        // Published htpasswd vectors for the password "password".
        assert_eq!(
            apr1(b"password", b"lZL6V/ci"),
            "$apr1$lZL6V/ci$eIMz/iKDkbtys/uU7LEK00"
        );
        assert_eq!(
            apr1(b"password", b"RandSalt"),
            "$apr1$RandSalt$PgCXHRrkpSt4cbyC2C6bm/"
        );
    }

    /// The check as a request sees it, with the off-worker part run in place.
    fn check_now(auth: &BasicAuth, field: Option<&[u8]>, ip: &str) -> Result<(), Refusal> {
        match auth.check(field, ip) {
            Checked::Pass => Ok(()),
            Checked::Refused(r) => Err(r),
            Checked::Verify(v) if v.hash.matches(&v.password) => {
                remember(v.key);
                Ok(())
            }
            Checked::Verify(_) => Err(Refusal::Challenge),
        }
    }

    #[test]
    fn an_unknown_user_is_checked_against_a_dummy_of_the_same_cost() {
        let hash = bcrypt::hash("s3cret", 5).unwrap();
        let (auth, _) = BasicAuth::parse("r", "f", &format!("alice:{hash}\n")).unwrap();
        let Hash::Bcrypt(d) = &auth.dummy else {
            panic!("a bcrypt dummy")
        };
        assert!(d.starts_with("$2b$05$"), "{d}");
        assert!(!auth.dummy.matches(""));
        let field = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("mallory:x")
        );
        match auth.check(Some(field.as_bytes()), "3.3.3.3") {
            Checked::Verify(v) => assert!(matches!(&v.hash, Hash::Bcrypt(h) if h == d)),
            _ => panic!("an unknown user is verified like a known one"),
        }
    }

    #[test]
    fn checks_and_remembers() {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let text = format!("# users\nalice:{hash}\nbob:$apr1$lZL6V/ci$eIMz/iKDkbtys/uU7LEK00\n");
        let (auth, weak) = BasicAuth::parse("admin", "f", &text).unwrap();
        assert_eq!(weak, ["bob"]);
        let basic = |u: &str, p: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        };
        let ok = basic("alice", "s3cret");
        assert_eq!(check_now(&auth, Some(ok.as_bytes()), "1.1.1.1"), Ok(()));
        assert_eq!(
            check_now(&auth, Some(basic("bob", "password").as_bytes()), "1.1.1.1"),
            Ok(())
        );
        assert_eq!(
            check_now(&auth, Some(basic("alice", "nope").as_bytes()), "1.1.1.1"),
            Err(Refusal::Challenge)
        );
        assert_eq!(check_now(&auth, None, "1.1.1.1"), Err(Refusal::Challenge));
        // Failed checks run out; remembered credentials still pass.
        for _ in 0..FAILED_PER_MINUTE {
            let _ = check_now(&auth, Some(basic("alice", "guess").as_bytes()), "2.2.2.2");
        }
        assert_eq!(
            check_now(&auth, Some(basic("alice", "guess").as_bytes()), "2.2.2.2"),
            Err(Refusal::TooMany)
        );
        assert_eq!(check_now(&auth, Some(ok.as_bytes()), "2.2.2.2"), Ok(()));
        assert!(BasicAuth::parse("r", "f", "carol:{SHA}abc").is_err());
    }
}
