//! Which shard a document goes to, computed exactly as OpenSearch (and Elasticsearch 7+) does:
//! murmur3 (x86, 32-bit, seed 0) of the routing value's UTF-16 code units, each written low
//! byte first; that hash (plus a partition offset for `routing_partition_size` indices) modulo
//! the index's `routing_num_shards`, divided by its routing factor
//! (`routing_num_shards / number_of_shards`, which keeps split and shrunk indices right).
//!
//! Hand-written because the hash must be bit-for-bit the cluster's (Lucene's
//! `StringHelper.murmurhash3_x86_32` over Java chars); the murmur3 crates hash bytes of a
//! different encoding or return other widths. Twenty lines, checked against a real cluster in
//! `tests/search.rs`.

/// murmur3 x86 32-bit of `data` with `seed`.
pub(crate) fn murmur3_x86_32(data: &[u8], seed: u32) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mut h = seed;
    let mut blocks = data.chunks_exact(4);
    for b in &mut blocks {
        let k = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        h ^= k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let mut k = 0u32;
        for (i, b) in tail.iter().enumerate() {
            k |= u32::from(*b) << (8 * i);
        }
        h ^= k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    }
    h ^= data.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// The cluster's hash of a routing value or document ID: murmur3 of its UTF-16 code units,
/// low byte first, as a Java `int`.
pub(crate) fn hash(value: &str) -> i32 {
    let mut bytes = Vec::with_capacity(value.len() * 2);
    for unit in value.encode_utf16() {
        bytes.extend_from_slice(&unit.to_le_bytes());
    }
    murmur3_x86_32(&bytes, 0) as i32
}

pub(crate) use crate::upstream::search_cluster::Sharding;

impl Sharding {
    /// The shard of a document with `id` and optional custom `routing`.
    pub fn shard(&self, id: &str, routing: Option<&str>) -> u32 {
        // An empty routing value is no routing value.
        let routing = routing.filter(|r| !r.is_empty());
        let (value, offset) = match routing {
            Some(r) if self.partition > 1 => (r, hash(id).rem_euclid(self.partition as i32)),
            Some(r) => (r, 0),
            None => (id, 0),
        };
        let h = hash(value).wrapping_add(offset);
        let factor = (self.routing_shards / self.shards.max(1)).max(1);
        (h.rem_euclid(self.routing_shards.max(1) as i32) as u32) / factor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur3_matches_the_reference_vectors() {
        // From the reference implementation's verification set (SMHasher, x86_32).
        assert_eq!(murmur3_x86_32(b"", 0), 0);
        assert_eq!(murmur3_x86_32(b"", 1), 0x514e_28b7);
        assert_eq!(murmur3_x86_32(b"", 0xffff_ffff), 0x81f1_6f39);
        assert_eq!(murmur3_x86_32(&[0, 0, 0, 0], 0), 0x2362_f9de);
        assert_eq!(murmur3_x86_32(&[0x21, 0x43, 0x65, 0x87], 0), 0xf55b_516b);
        assert_eq!(murmur3_x86_32(&[0x21, 0x43, 0x65], 0), 0x7e4a_8634);
        assert_eq!(murmur3_x86_32(&[0x21, 0x43], 0), 0xa0f7_b07a);
        assert_eq!(murmur3_x86_32(&[0x21], 0), 0x7266_1cf4);
        assert_eq!(
            murmur3_x86_32(&[0x21, 0x43, 0x65, 0x87], 0x5082_edee),
            0x2362_f9de
        );
    }

    #[test]
    fn strings_hash_as_the_cluster_hashes_them() {
        // The values of Elasticsearch's and OpenSearch's Murmur3HashFunctionTests.
        for (text, want) in [
            ("hell", 0x5a0c_b7c3_u32),
            ("hello", 0xd7c3_1989),
            ("hello w", 0x22ab_2984),
            ("hello wo", 0xdf0c_a123),
            ("hello wor", 0xe774_4d61),
            ("The quick brown fox jumps over the lazy dog", 0xe07d_b09c),
            ("The quick brown fox jumps over the lazy cog", 0x4e63_d2ad),
        ] {
            assert_eq!(hash(text), want as i32, "{text}");
        }
    }

    #[test]
    fn shards_stay_in_range_and_scale_with_the_routing_factor() {
        let s = Sharding {
            shards: 3,
            routing_shards: 768,
            partition: 1,
        };
        for i in 0..1000 {
            let id = format!("doc-{i}");
            let shard = s.shard(&id, None);
            assert!(shard < 3);
            // The same routing value always lands on the same shard, whatever the ID.
            assert_eq!(
                s.shard(&id, Some("user-7")),
                s.shard("other", Some("user-7"))
            );
        }
        // One shard: everything on shard 0.
        let one = Sharding {
            shards: 1,
            routing_shards: 1,
            partition: 1,
        };
        assert_eq!(one.shard("anything", None), 0);
    }
}
