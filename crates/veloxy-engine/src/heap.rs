//! Giving freed heap memory back to the operating system.
//!
//! glibc keeps freed pages in its arenas for reuse: after a burst of connections, or after a
//! large config's parse (100,000 routes: about 130 MB of TOML document, freed once compiled),
//! the process would stay that large. [`trim`] returns what is free. [`Counted`] is how the
//! config's objects report their bytes (`config::footprint`).

/// Config texts at least this large are followed by a trim once compiled (a smaller one frees
/// too little to be worth walking the heap).
pub(crate) const TRIM_AFTER_CONFIG_BYTES: usize = 1 << 20;

/// Returns the heap's free pages to the OS (`malloc_trim(0)`); nothing where the allocator is
/// not glibc's. It walks every free chunk, so it belongs after bursts, not on a request path.
pub(crate) fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it is thread-safe (it locks each arena in
    // turn).
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Counts and bytes of one kind of object.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    /// How many.
    pub count: usize,
    /// Their bytes, all together.
    pub bytes: usize,
}

impl Counted {
    /// Adds another's counts and bytes.
    pub(crate) fn add(&mut self, other: Counted) {
        self.count += other.count;
        self.bytes += other.bytes;
    }

    /// The bytes of one, on average.
    pub(crate) fn each(&self) -> usize {
        self.bytes.checked_div(self.count).unwrap_or(0)
    }
}
