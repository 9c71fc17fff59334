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

/// Backs the heap mappings holding `addrs` with 2 MiB pages: `MADV_HUGEPAGE` (later growth
/// faults in huge pages) and `MADV_COLLAPSE` (what is there now is copied into them, at once,
/// Linux 6.1 and later). For a large compiled config: 100,000 routes spread their host maps,
/// slots and routes over some 30 MB, and with 4 KiB pages most lookups miss the TLB and walk
/// the page table besides missing the cache. Only anonymous read-write mappings are touched;
/// errors (an older kernel, THP set to `never`, no free huge page) leave the memory as it
/// was. Returns the bytes collapsed.
pub(crate) fn huge_pages(addrs: &[usize]) -> usize {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
            return 0;
        };
        let mut done: Vec<(usize, usize)> = Vec::new();
        for line in maps.lines() {
            let mut f = line.split_whitespace();
            let (Some(range), Some(perms)) = (f.next(), f.next()) else {
                continue;
            };
            // Anonymous: no path (the 6th field), or a heap.
            let path = f.nth(3);
            if !perms.starts_with("rw") || path.is_some_and(|p| p != "[heap]") {
                continue;
            }
            let Some((lo, hi)) = range.split_once('-') else {
                continue;
            };
            let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            else {
                continue;
            };
            if addrs.iter().any(|a| (lo..hi).contains(a)) {
                let (start, end) = (lo.next_multiple_of(HUGE), hi / HUGE * HUGE);
                if start < end {
                    done.push((start, end));
                }
            }
        }
        let mut bytes = 0;
        for (start, end) in done {
            let (ptr, len) = (start as *mut libc::c_void, end - start);
            // SAFETY: advice on a range of this process's own anonymous mappings, read from
            // /proc/self/maps just now; neither call changes the memory's contents.
            let collapsed = unsafe {
                libc::madvise(ptr, len, libc::MADV_HUGEPAGE);
                libc::madvise(ptr, len, 25 /* MADV_COLLAPSE */) == 0
            };
            if collapsed {
                bytes += len;
            }
        }
        bytes
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = addrs;
        0
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
    #[test]
    #[cfg(target_os = "linux")]
    fn a_large_allocation_is_collapsed_into_huge_pages() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        if thp.map_or(true, |t| t.contains("[never]")) {
            eprintln!("skipped: transparent huge pages are off here");
            return;
        }
        // 16 MiB: glibc maps it on its own, so the mapping is this vector's alone.
        let v = vec![7u8; 16 << 20];
        let at = v.as_ptr() as usize + (8 << 20);
        let bytes = super::huge_pages(&[at]);
        assert!(bytes >= 2 << 20, "collapsed {bytes} bytes");
        assert!(v.iter().all(|&b| b == 7), "the contents stay");
        assert_eq!(super::huge_pages(&[]), 0);
    }
}
