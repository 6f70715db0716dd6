//! Worker ids of Pods found through the Kubernetes API (DISC-HASH): Dynamo's `hash_pod_name`.
//!
//! Upstream (`lib/runtime/src/discovery/kube/utils.rs`, unchanged from 1.4.2 to 1.6.1) hashes
//! the Pod name with `std`'s `DefaultHasher::new()` and `str::hash`, i.e. SipHash-1-3 with an
//! all-zero key over the name's UTF-8 bytes followed by one `0xFF` byte, and keeps the low 53
//! bits. The router cannot call `DefaultHasher` for this: its algorithm is not promised to stay
//! the same across compiler versions (DISC-HASH-03). So SipHash-1-3 is written out here, and a
//! test of every build compares it with the toolchain's `DefaultHasher` to catch drift either
//! way (DISC-HASH-04).
//!
//! Invariants: total over every input (no panics, no allocation); [`hash_pod_name`] is below
//! 2^53, so it survives any JSON number round trip.

use super::ids::InstanceId;

/// The bits of the hash kept as the worker id (the low 53).
pub const POD_ID_MASK: u64 = 0x001F_FFFF_FFFF_FFFF;

/// The worker id Dynamo gives the Pod named `name` (DISC-HASH-01).
pub fn hash_pod_name(name: &str) -> InstanceId {
    let mut h = SipHash13::new(0, 0);
    h.write(name.as_bytes());
    h.write(&[0xFF]);
    InstanceId::new(h.finish() & POD_ID_MASK)
}

/// SipHash-1-3 (one compression round per 8-byte word, three finalisation rounds), as `std`'s
/// `DefaultHasher` computes it.
pub type SipHash13 = SipHash<1, 3>;

/// SipHash-c-d over bytes written in any number of pieces: `C` compression rounds per 8-byte
/// word, `D` finalisation rounds. (SipHash-2-4 exists here only to be tested against `std`'s
/// keyed `SipHasher`.)
#[derive(Debug, Clone)]
pub struct SipHash<const C: usize, const D: usize> {
    v: [u64; 4],
    /// Bytes written so far (only its low byte enters the final word).
    len: u64,
    /// Bytes not yet compressed (fewer than 8), little-endian in the low bits.
    tail: u64,
    ntail: u32,
}

impl<const C: usize, const D: usize> SipHash<C, D> {
    /// A hasher keyed with `(k0, k1)`.
    pub fn new(k0: u64, k1: u64) -> Self {
        Self {
            v: [
                k0 ^ 0x736f_6d65_7073_6575,
                k1 ^ 0x646f_7261_6e64_6f6d,
                k0 ^ 0x6c79_6765_6e65_7261,
                k1 ^ 0x7465_6462_7974_6573,
            ],
            len: 0,
            tail: 0,
            ntail: 0,
        }
    }

    fn round(&mut self) {
        let v = &mut self.v;
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }

    fn compress(&mut self, m: u64) {
        self.v[3] ^= m;
        for _ in 0..C {
            self.round();
        }
        self.v[0] ^= m;
    }

    /// Feed `bytes`.
    pub fn write(&mut self, bytes: &[u8]) {
        self.len = self.len.wrapping_add(bytes.len() as u64);
        let mut rest = bytes;
        // Complete a pending word first.
        while self.ntail > 0 && self.ntail < 8 {
            let Some((&b, more)) = rest.split_first() else {
                return;
            };
            self.tail |= u64::from(b) << (8 * self.ntail);
            self.ntail += 1;
            rest = more;
        }
        if self.ntail == 8 {
            let m = self.tail;
            self.compress(m);
            self.tail = 0;
            self.ntail = 0;
        }
        let mut words = rest.chunks_exact(8);
        for w in &mut words {
            let mut le = [0u8; 8];
            le.copy_from_slice(w);
            self.compress(u64::from_le_bytes(le));
        }
        for (i, &b) in words.remainder().iter().enumerate() {
            self.tail |= u64::from(b) << (8 * i);
        }
        self.ntail = words.remainder().len() as u32;
    }

    /// The 64-bit hash of everything written.
    pub fn finish(&self) -> u64 {
        let mut s = self.clone();
        let last = ((s.len & 0xFF) << 56) | s.tail;
        s.compress(last);
        s.v[2] ^= 0xFF;
        for _ in 0..D {
            s.round();
        }
        s.v[0] ^ s.v[1] ^ s.v[2] ^ s.v[3]
    }
}

#[cfg(test)]
mod tests {
    use std::hash::{Hash, Hasher};

    use super::*;

    /// What `std`'s `DefaultHasher` makes of `name` (upstream's exact code path).
    fn std_pod_hash(name: &str) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        name.hash(&mut h);
        h.finish() & POD_ID_MASK
    }

    #[test]
    fn the_spec_vector_holds() {
        assert_eq!(hash_pod_name("worker-0").get(), 1_186_445_869_714_687);
    }

    #[test]
    fn the_rounds_and_keying_match_std_siphash_2_4() {
        // The same code with 2-4 rounds against `std`'s keyed SipHash-2-4 (deprecated but
        // stable), for every tail length and several keys: the word loop, the tail, the length
        // byte and the key schedule are then those of the reference algorithm.
        let input: Vec<u8> = (0..64).collect();
        for (k0, k1) in [
            (0, 0),
            (0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908),
            (u64::MAX, 1),
        ] {
            for n in 0..64 {
                let mut ours = SipHash::<2, 4>::new(k0, k1);
                ours.write(&input[..n]);
                #[allow(deprecated)]
                let mut std_h = std::hash::SipHasher::new_with_keys(k0, k1);
                std_h.write(&input[..n]);
                assert_eq!(
                    ours.finish(),
                    std_h.finish(),
                    "length {n}, key ({k0:#x}, {k1:#x})"
                );
            }
        }
    }

    #[test]
    fn it_matches_this_toolchains_default_hasher_on_names_of_every_length() {
        // Drift check in every build (DISC-HASH-04): the hand-written hash and the toolchain's
        // `DefaultHasher` agree; if a compiler ever changes `DefaultHasher`, this fails and the
        // fleet's ids (made by Dynamo's compiler) must be checked by hand.
        let mut name = String::new();
        for i in 0..300u32 {
            let c = char::from_u32(0x61 + (i * 7) % 26).unwrap_or('x');
            name.push(c);
            if i % 13 == 0 {
                name.push('é');
            }
            assert_eq!(hash_pod_name(&name).get(), std_pod_hash(&name), "{name:?}");
        }
        for name in [
            "",
            "a",
            "worker-0",
            "vllm-agg-worker-5f7d8c9b6-x2x9q",
            "日本語-pod",
        ] {
            assert_eq!(hash_pod_name(name).get(), std_pod_hash(name), "{name:?}");
        }
    }

    #[test]
    fn bytes_written_in_pieces_hash_like_one_write() {
        let data: Vec<u8> = (0..100u8).collect();
        let mut whole = SipHash13::new(3, 4);
        whole.write(&data);
        for split in [0, 1, 3, 7, 8, 9, 15, 16, 17, 99, 100] {
            let mut parts = SipHash13::new(3, 4);
            let (a, b) = data.split_at(split);
            parts.write(a);
            for chunk in b.chunks(5) {
                parts.write(chunk);
            }
            assert_eq!(parts.finish(), whole.finish(), "split at {split}");
        }
    }

    #[test]
    fn ids_fit_in_53_bits() {
        for n in 0..1000 {
            assert!(hash_pod_name(&format!("pod-{n}")).get() <= POD_ID_MASK);
        }
    }
}
