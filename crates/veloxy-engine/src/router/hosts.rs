//! The router's host tables: a host's [`Slot`]s found by its name in one flat table.
//!
//! A lookup touches three places: the hash table's control bytes and its 24-byte entry (which
//! holds the key's full hash, so a bucket of another host is passed without reading its
//! name), the name's bytes in one arena of every host name, and the host's slots, which lie
//! together in one array of every host's slots. A `HashMap<Box<[u8]>, Vec<Slot>>` reads a
//! separately allocated key and a separately allocated slot list per lookup: with 10,000
//! hosts spread over memory, each is a cache miss, and they were a third of what a table of
//! 100,000 routes added to a request (the scale benchmark's profile). `hashbrown`'s
//! `HashTable` keeps the probing; only the layout is ours.

use std::hash::{BuildHasher, Hasher};

use super::Slot;

/// One host of a [`HostTable`].
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The name's hash (the table rehashes with it; compared before the name).
    hash: u64,
    /// The name: `keys[key..key + key_len]`.
    key: u32,
    key_len: u32,
    /// Its slots: `slots[at..at + len]`, in precedence order.
    at: u32,
    len: u32,
}

/// Slots by host name, built once from `(name, slots)` pairs ([`HostTable::build`]).
#[derive(Debug, Clone, Default)]
pub(super) struct HostTable {
    table: hashbrown::HashTable<Entry>,
    keys: Vec<u8>,
    slots: Vec<Slot>,
}

fn hash(name: &[u8]) -> u64 {
    let mut h = rustc_hash::FxBuildHasher.build_hasher();
    h.write(name);
    h.finish()
}

impl HostTable {
    /// The table of `hosts` (each name once), the slots of each kept in their order.
    pub fn build<'a>(hosts: impl ExactSizeIterator<Item = (&'a [u8], &'a [Slot])>) -> HostTable {
        let hosts: Vec<_> = hosts.collect();
        let mut t = HostTable {
            table: hashbrown::HashTable::with_capacity(hosts.len()),
            keys: Vec::with_capacity(hosts.iter().map(|(name, _)| name.len()).sum()),
            slots: Vec::with_capacity(hosts.iter().map(|(_, slots)| slots.len()).sum()),
        };
        // Read at random by requests: huge pages spare the TLB misses (`heap::huge_pages`).
        crate::heap::huge_pages(&t.slots);
        crate::heap::huge_pages(&t.keys);
        for (name, slots) in hosts {
            let e = Entry {
                hash: hash(name),
                key: u32::try_from(t.keys.len()).expect("host names under 4 GiB"),
                key_len: name.len() as u32,
                at: u32::try_from(t.slots.len()).expect("under 2^32 routes"),
                len: slots.len() as u32,
            };
            t.keys.extend_from_slice(name);
            t.slots.extend_from_slice(slots);
            t.table.insert_unique(e.hash, e, |e| e.hash);
        }
        t
    }

    /// The slots of `name`, if the table has it.
    #[inline]
    pub fn get(&self, name: &[u8]) -> Option<&[Slot]> {
        let h = hash(name);
        let e = self.table.find(h, |e| {
            e.hash == h && &self.keys[e.key as usize..(e.key + e.key_len) as usize] == name
        })?;
        Some(&self.slots[e.at as usize..(e.at + e.len) as usize])
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Bytes held: the table's entries (and a control byte each), the names, the slots.
    pub fn bytes(&self) -> usize {
        use std::mem::size_of;
        self.table.capacity() * (size_of::<Entry>() + 1)
            + self.keys.capacity()
            + self.slots.capacity() * size_of::<Slot>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(at: u32) -> Slot {
        Slot {
            at,
            kind: Slot::PREFIX,
            conds: false,
            len: 1,
            head: [b'/'; super::super::SLOT_PATH],
        }
    }

    #[test]
    fn every_host_finds_its_own_slots_and_no_other_name_finds_any() {
        let names: Vec<Vec<u8>> = (0..5000)
            .map(|i| format!("h{i}.example.test").into_bytes())
            .collect();
        let lists: Vec<Vec<Slot>> = (0..5000u32)
            .map(|i| (0..i % 4 + 1).map(|k| slot(i * 10 + k)).collect())
            .collect();
        let t = HostTable::build(
            names
                .iter()
                .map(|n| n.as_slice())
                .zip(lists.iter().map(|l| l.as_slice())),
        );
        assert_eq!(t.len(), 5000);
        for (i, n) in names.iter().enumerate() {
            let got: Vec<u32> = t.get(n).unwrap().iter().map(|s| s.at).collect();
            let want: Vec<u32> = lists[i].iter().map(|s| s.at).collect();
            assert_eq!(got, want, "{}", String::from_utf8_lossy(n));
        }
        for miss in [
            &b"h5000.example.test"[..],
            b"h1.example.tes",
            b"",
            b"h1.example.test.",
        ] {
            assert!(t.get(miss).is_none(), "{}", String::from_utf8_lossy(miss));
        }
        assert!(HostTable::default().get(b"x").is_none());
    }
}
