//! The disk tier of a cache (`disk = { path, size }`): every stored entry is also written to
//! a file, so a restart (or a memory eviction) does not lose it.
//!
//! One file per key, named by the SHA-1 of the key (`ab/abcdef....vxc`), written to a temporary
//! name and renamed into place. The file carries the key (a hash collision reads as a miss) and
//! a CRC-32 of everything before it: a file that is truncated, corrupt or of another version
//! is deleted when read and counts as a miss (`veloxy_cache_disk_errors_total`). Writes and
//! reads run on tokio's blocking pool, never on a worker thread; a full disk or any I/O error
//! only costs the copy on disk. The total size is kept under `size` by deleting the least
//! recently used files; the index of sizes is rebuilt in the background at start.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use sha1::Digest;

use super::policy::Lifetime;
use super::{Entry, Object, Purge};

const MAGIC: &[u8; 4] = b"VXC2";

/// A cache's directory of entries.
pub(crate) struct Disk {
    dir: PathBuf,
    max: u64,
    index: Mutex<Index>,
    /// Entries that could not be read (corrupt) or written.
    pub errors: AtomicU64,
    pub bytes: AtomicU64,
}

#[derive(Default)]
struct Index {
    files: HashMap<String, Meta>,
    /// Use order: tick -> file name (least recently used first).
    order: BTreeMap<u64, String>,
    tick: u64,
    total: u64,
}

struct Meta {
    key: Box<str>,
    tags: Box<[Box<str>]>,
    size: u64,
    used: u64,
}

impl Disk {
    /// Opens (creating) `dir`; its existing entries are indexed in the background.
    pub(crate) fn open(dir: &Path, max: u64) -> std::io::Result<Arc<Disk>> {
        std::fs::create_dir_all(dir)?;
        let disk = Arc::new(Disk {
            dir: dir.to_path_buf(),
            max,
            index: Mutex::new(Index::default()),
            errors: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        });
        let d = disk.clone();
        std::thread::Builder::new()
            .name("veloxy-cache-scan".into())
            .spawn(move || d.scan())?;
        Ok(disk)
    }

    fn path_of(&self, key: &str) -> (String, PathBuf) {
        let hex: String = sha1::Sha1::digest(key.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let path = self.file(&hex);
        (hex, path)
    }

    /// The file of the entry named `name` (its key's SHA-1 in hex).
    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(&name[..2]).join(format!("{name}.vxc"))
    }

    /// Writes `entry` under `key`, in the background.
    pub(crate) fn save(self: &Arc<Self>, key: Arc<str>, entry: Entry) {
        let d = self.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = d.write(&key, &entry) {
                d.errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "cache: disk write failed (kept in memory only)");
            }
        });
    }

    fn write(&self, key: &str, entry: &Entry) -> std::io::Result<()> {
        let data = encode(key, entry);
        let (name, path) = self.path_of(key);
        let parent = path.parent().expect("two levels");
        std::fs::create_dir_all(parent)?;
        let tmp = parent.join(format!(".{name}.tmp"));
        let written = std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(&data))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            // Whatever failed (a full disk mid-write, most often), the partial file goes: a
            // full disk must not stay full of them until a restart.
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        let tags = match entry {
            Entry::Object(o) => o.tags.clone(),
            _ => Box::default(),
        };
        self.note(name, key.into(), tags, data.len() as u64);
        self.evict();
        Ok(())
    }

    fn note(&self, name: String, key: Box<str>, tags: Box<[Box<str>]>, size: u64) {
        let mut ix = self.index.lock().unwrap_or_else(|e| e.into_inner());
        ix.tick += 1;
        let used = ix.tick;
        if let Some(old) = ix.files.remove(&name) {
            ix.order.remove(&old.used);
            ix.total -= old.size;
        }
        ix.order.insert(used, name.clone());
        ix.total += size;
        ix.files.insert(
            name,
            Meta {
                key,
                tags,
                size,
                used,
            },
        );
        self.bytes.store(ix.total, Ordering::Relaxed);
    }

    /// Deletes least recently used files until the total fits.
    fn evict(&self) {
        let mut victims = Vec::new();
        {
            let mut ix = self.index.lock().unwrap_or_else(|e| e.into_inner());
            while ix.total > self.max {
                let Some((_, name)) = ix.order.pop_first() else {
                    break;
                };
                if let Some(m) = ix.files.remove(&name) {
                    ix.total -= m.size;
                }
                victims.push(name);
            }
            self.bytes.store(ix.total, Ordering::Relaxed);
        }
        for name in victims {
            let _ = std::fs::remove_file(self.file(&name));
        }
    }

    /// Reads the entry stored under `key`, off the worker thread.
    pub(crate) async fn load(self: &Arc<Self>, key: Arc<str>) -> Option<Entry> {
        let d = self.clone();
        let read = tokio::task::spawn_blocking(move || d.read(&key));
        tokio::time::timeout(Duration::from_secs(2), read)
            .await
            .ok()?
            .ok()?
    }

    fn read(&self, key: &str) -> Option<Entry> {
        let (name, path) = self.path_of(key);
        let data = std::fs::read(&path).ok()?;
        match decode(&data) {
            Some((k, entry)) if k == key => {
                let mut ix = self.index.lock().unwrap_or_else(|e| e.into_inner());
                ix.tick += 1;
                let tick = ix.tick;
                if let Some(used) = ix
                    .files
                    .get_mut(&name)
                    .map(|m| std::mem::replace(&mut m.used, tick))
                {
                    ix.order.remove(&used);
                    ix.order.insert(tick, name);
                }
                Some(entry)
            }
            Some(_) => None, // another key with the same hash
            None => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(file = %path.display(), "cache: corrupt disk entry deleted");
                self.forget(&name, &path);
                None
            }
        }
    }

    fn forget(&self, name: &str, path: &Path) {
        let _ = std::fs::remove_file(path);
        let mut ix = self.index.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = ix.files.remove(name) {
            ix.order.remove(&m.used);
            ix.total -= m.size;
        }
        self.bytes.store(ix.total, Ordering::Relaxed);
    }

    /// Removes the files `selector` picks (as the memory tier's purge does).
    pub(crate) fn purge(&self, selector: &Purge) -> usize {
        let picked: Vec<String> = {
            let ix = self.index.lock().unwrap_or_else(|e| e.into_inner());
            ix.files
                .iter()
                .filter(|(_, m)| match selector {
                    Purge::Key(k) => {
                        *m.key == **k
                            || m.key
                                .starts_with(&format!("{k}{}", super::lookup::VARIANT_MARK))
                    }
                    Purge::Prefix(p) => m.key.starts_with(p.as_str()),
                    Purge::Tag(t) => m.tags.iter().any(|x| **x == **t),
                })
                .map(|(n, _)| n.clone())
                .collect()
        };
        for name in &picked {
            self.forget(name, &self.file(name));
        }
        picked.len()
    }

    /// Indexes the files already on disk (at start), checking each one whole.
    fn scan(&self) {
        let Ok(dirs) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for sub in dirs.flatten() {
            let Ok(files) = std::fs::read_dir(sub.path()) else {
                continue;
            };
            for f in files.flatten() {
                let path = f.path();
                let name = f.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') {
                    let _ = std::fs::remove_file(&path); // an interrupted write
                    continue;
                }
                let Some(name) = name.strip_suffix(".vxc").map(str::to_owned) else {
                    continue;
                };
                match std::fs::read(&path).ok().as_deref().and_then(decode) {
                    Some((key, entry)) => {
                        let tags = match entry {
                            Entry::Object(o) => o.tags.clone(),
                            _ => Box::default(),
                        };
                        let size = f.metadata().map_or(0, |m| m.len());
                        self.note(name, key.into(), tags, size);
                    }
                    None => {
                        self.errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(file = %path.display(), "cache: corrupt disk entry deleted");
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
        }
        self.evict();
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

/// The file image of an entry (a hit-for-pass is not worth keeping: `Pass` writes nothing
/// useful and is never saved).
fn encode(key: &str, entry: &Entry) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(MAGIC);
    put_bytes(&mut out, key.as_bytes());
    match entry {
        Entry::Vary(names) => {
            out.push(1);
            put_bytes(&mut out, names.join("\n").as_bytes());
        }
        Entry::Object(o) => {
            out.push(0);
            out.extend_from_slice(&o.status.to_le_bytes());
            for v in [
                o.born_ms,
                o.life.fresh.as_millis() as u64,
                o.life.stale_while_revalidate.as_millis() as u64,
                o.life.stale_if_error.as_millis() as u64,
                u64::from(o.life.always_revalidate),
                u64::from(o.compressible),
            ] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            put_bytes(&mut out, o.etag.as_deref().unwrap_or(b""));
            let (lm, lm_secs) = o.last_modified.clone().unwrap_or_default();
            put_bytes(&mut out, &lm);
            out.extend_from_slice(&lm_secs.to_le_bytes());
            put_bytes(&mut out, o.tags.join("\n").as_bytes());
            put_bytes(&mut out, &o.lines);
            put_bytes(&mut out, &o.body);
        }
        Entry::Pass(_) => out.push(2),
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Reads a file image back; `None` when it is not one, whole and intact.
fn decode(data: &[u8]) -> Option<(String, Entry)> {
    let (body, crc) = data.split_at_checked(data.len().checked_sub(4)?)?;
    if crc32fast::hash(body).to_le_bytes() != crc || !body.starts_with(MAGIC) {
        return None;
    }
    let mut r = Reader(&body[4..]);
    let key = String::from_utf8(r.bytes()?.to_vec()).ok()?;
    let entry = match r.take(1)?[0] {
        1 => {
            let names = std::str::from_utf8(r.bytes()?).ok()?;
            Entry::Vary(names.split('\n').map(Into::into).collect::<Vec<_>>().into())
        }
        0 => {
            let status = u16::from_le_bytes(r.take(2)?.try_into().ok()?);
            let mut n = [0u64; 6];
            for v in &mut n {
                *v = r.u64()?;
            }
            let etag = r.bytes()?;
            let lm = r.bytes()?;
            let lm_secs = r.u64()?;
            let tags = std::str::from_utf8(r.bytes()?).ok()?;
            let lines = Bytes::copy_from_slice(r.bytes()?);
            let body = Bytes::copy_from_slice(r.bytes()?);
            Entry::Object(Arc::new(Object {
                status,
                lines,
                body,
                etag: (!etag.is_empty()).then(|| Bytes::copy_from_slice(etag)),
                last_modified: (!lm.is_empty()).then(|| (Bytes::copy_from_slice(lm), lm_secs)),
                tags: tags
                    .split('\n')
                    .filter(|t| !t.is_empty())
                    .map(Into::into)
                    .collect(),
                born_ms: n[0],
                compressible: n[5] != 0,
                encoded: Default::default(),
                life: Lifetime {
                    fresh: Duration::from_millis(n[1]),
                    stale_while_revalidate: Duration::from_millis(n[2]),
                    stale_if_error: Duration::from_millis(n[3]),
                    always_revalidate: n[4] != 0,
                },
            }))
        }
        _ => return None,
    };
    r.0.is_empty().then_some((key, entry))
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (a, b) = self.0.split_at_checked(n)?;
        self.0 = b;
        Some(a)
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        self.take(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_any_flipped_byte_is_caught() {
        let obj = Object {
            status: 200,
            lines: Bytes::from_static(b"content-type: text/plain\r\n"),
            body: Bytes::from_static(b"hello"),
            etag: Some(Bytes::from_static(b"\"v1\"")),
            last_modified: None,
            tags: vec!["a".into(), "b".into()].into(),
            born_ms: 123,
            compressible: true,
            encoded: Default::default(),
            life: Lifetime {
                fresh: Duration::from_secs(60),
                stale_while_revalidate: Duration::ZERO,
                stale_if_error: Duration::from_secs(5),
                always_revalidate: false,
            },
        };
        let data = encode("GETa/b", &Entry::Object(Arc::new(obj)));
        let (key, e) = decode(&data).unwrap();
        assert_eq!(key, "GETa/b");
        let Entry::Object(o) = e else { panic!() };
        assert_eq!(
            (&o.body[..], o.born_ms, o.tags.len()),
            (&b"hello"[..], 123, 2)
        );
        assert_eq!(o.life.stale_if_error, Duration::from_secs(5));
        for i in 0..data.len() {
            let mut bad = data.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad).is_none(), "byte {i}");
        }
        assert!(decode(&data[..data.len() - 1]).is_none());
        let vary = encode("k", &Entry::Vary(vec!["accept".into()].into()));
        assert!(matches!(decode(&vary), Some((_, Entry::Vary(n))) if n.len() == 1));
    }
}
