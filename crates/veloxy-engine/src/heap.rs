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

/// Buffers at least this large are backed by huge pages when [`huge_pages`] is asked.
const HUGE_FROM: usize = 2 << 20;

/// Asks the kernel to back `v`'s buffer with transparent huge pages (`MADV_HUGEPAGE`; the
/// kernel's default mode, `madvise`, gives them only where asked), when the buffer is at
/// least 2 MiB. For tables read at random by requests, such as the router's routes and slots
/// with 100,000 routes: with 4 KiB pages nearly every cold lookup also missed the TLB (a
/// page walk, itself a cache miss or two). Call it on an empty buffer of the final capacity,
/// before filling it, so the pages are huge from their first touch. Advice only: where the
/// kernel has no huge pages to give, or is not Linux, nothing changes.
pub(crate) fn huge_pages<T>(v: &Vec<T>) {
    let bytes = v.capacity() * std::mem::size_of::<T>();
    if bytes < HUGE_FROM {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let at = v.as_ptr() as usize;
        let (start, end) = (at.next_multiple_of(PAGE), (at + bytes) & !(PAGE - 1));
        if end > start {
            // SAFETY: the range lies within `v`'s allocation, and MADV_HUGEPAGE changes how
            // its pages are backed, never their contents.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
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

#[cfg(test)]
mod tests {
    /// The `AnonHugePages` of the mapping that holds `addr`, in kB (`/proc/self/smaps`).
    fn huge_kb_at(addr: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split(' ').next().unwrap_or("");
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = (a..b).contains(&addr);
                    continue;
                }
            }
            if inside && line.starts_with("AnonHugePages:") {
                return line.split_whitespace().nth(1)?.parse().ok();
            }
        }
        None
    }

    /// A buffer of 8 MiB asked for huge pages before it is filled has some once filled (seen
    /// failing with the advice changed to `MADV_NORMAL`). The kernel's mode must not be
    /// `never`; with `always`, every large buffer has them anyway, and the test proves less.
    #[test]
    fn a_large_table_is_backed_by_huge_pages() {
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !mode.contains("[madvise]") && !mode.contains("[always]") {
            eprintln!(
                "skipped: transparent huge pages are off here ({})",
                mode.trim()
            );
            return;
        }
        let mut big: Vec<u64> = Vec::with_capacity(1 << 20);
        super::huge_pages(&big);
        big.extend((0..1u64 << 20).map(|i| i.wrapping_mul(31)));
        let kb = huge_kb_at(big.as_ptr() as usize + (4 << 20)).unwrap_or(0);
        assert!(kb >= 2048, "AnonHugePages of an 8 MiB table: {kb} kB");
        assert_eq!(big[12345], 12345 * 31);
    }
}
