//! Large in-memory bodies (cached answers) kept in an anonymous memory file (`memfd`) and
//! mapped, so the same pages are both the body's [`Bytes`] (for TLS, HTTP/2 and HTTP/3
//! writers) and a file a plain-TCP HTTP/1 writer hands to `sendfile(2)`: the kernel then
//! attaches the pages to the socket instead of copying the bytes from user memory, as nginx
//! does with `proxy_cache` files on tmpfs. On a 100 KB answer that copy was most of the
//! proxy's CPU. Hand-written (a few `libc` calls) because no maintained crate pairs a memfd
//! with `Bytes`.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;

/// Bodies smaller than this stay plain bytes: one `sendmsg` with the head is cheaper.
pub(crate) const MIN_LEN: usize = 32 * 1024;
/// Memory files open at once in the process; past it bodies stay plain bytes, so a cache of
/// many large objects never eats the descriptor limit.
pub(crate) const MAX_OPEN: usize = 1024;

static OPEN: AtomicUsize = AtomicUsize::new(0);

/// An anonymous memory file holding one body.
#[derive(Debug)]
pub struct Memfd {
    file: File,
}

impl Memfd {
    /// The file, for `sendfile`.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }
}

impl Drop for Memfd {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The pages of a [`Memfd`], mapped read-only: what the body's `Bytes` point into.
struct Mapping {
    ptr: *const u8,
    len: usize,
    _file: Arc<Memfd>,
}

// SAFETY: the mapping is read-only and lives until `Mapping` drops; the file (which keeps
// the pages) outlives it through `_file`.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl AsRef<[u8]> for Mapping {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is a live read-only mapping of the file (see `adopt`).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `adopt` mapped.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Moves a large body into a memory file: returns the same bytes, now in the file's mapped
/// pages, and the file. Small bodies, a full quota or any failure keep `body` as it is.
pub(crate) fn adopt(body: Bytes) -> (Bytes, Option<Arc<Memfd>>) {
    if body.len() < MIN_LEN || OPEN.fetch_add(1, Ordering::Relaxed) >= MAX_OPEN {
        if body.len() >= MIN_LEN {
            OPEN.fetch_sub(1, Ordering::Relaxed);
        }
        return (body, None);
    }
    match map(&body) {
        Some((bytes, file)) => (bytes, Some(file)),
        None => (body, None),
    }
}

fn map(body: &[u8]) -> Option<(Bytes, Arc<Memfd>)> {
    // SAFETY: a NUL-terminated name; the returned descriptor is owned by the File.
    let fd = unsafe { libc::memfd_create(c"veloxy-cache".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        OPEN.fetch_sub(1, Ordering::Relaxed);
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let memfd = Arc::new(Memfd {
        file: unsafe { File::from_raw_fd(fd) },
    });
    use std::io::Write;
    (&memfd.file).write_all(body).ok()?;
    // SAFETY: maps `len` bytes of a file that holds exactly `len` bytes, read-only, shared.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            body.len(),
            libc::PROT_READ,
            libc::MAP_SHARED,
            memfd.file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return None;
    }
    let mapping = Mapping {
        ptr: ptr as *const u8,
        len: body.len(),
        _file: memfd.clone(),
    };
    Some((Bytes::from_owner(mapping), memfd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_body_reads_the_same_from_its_bytes_and_its_file() {
        let body: Bytes = (0..100_000u32)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<_>>()
            .into();
        let (bytes, file) = adopt(body.clone());
        let file = file.expect("a memory file");
        assert_eq!(bytes, body);
        let mut read = Vec::new();
        use std::io::{Read, Seek};
        let mut f = file.file();
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.read_to_end(&mut read).unwrap();
        assert_eq!(read, body);
        drop(file);
        // The bytes keep the mapping alive on their own.
        assert_eq!(bytes.slice(99_990..), body.slice(99_990..));
        let (small, none) = adopt(Bytes::from_static(b"small"));
        assert!(none.is_none());
        assert_eq!(small, "small");
    }
}
