//! SHA-1 (FIPS 180-4), only for the `Sec-WebSocket-Accept` key: RFC 6455 §4.2.2 fixes the hash,
//! and it hashes 60 public bytes per handshake, so a few dozen lines beat a dependency. SHA-1's
//! collision weakness does not matter here; the accept key only proves the server read the
//! request as a WebSocket upgrade. Tested against the FIPS 180 example vectors.

const INITIAL: [u32; 5] = [
    0x6745_2301,
    0xefcd_ab89,
    0x98ba_dcfe,
    0x1032_5476,
    0xc3d2_e1f0,
];

/// The SHA-1 digest of the concatenation of `parts` (no copy into one buffer needed).
pub(crate) fn sha1(parts: &[&[u8]]) -> [u8; 20] {
    let mut state = INITIAL;
    let mut block = [0u8; 64];
    let mut used = 0;
    let mut total_bits: u64 = 0;
    for part in parts {
        for &byte in *part {
            block[used] = byte;
            used += 1;
            if used == block.len() {
                compress(&mut state, &block);
                used = 0;
            }
        }
        total_bits = total_bits.wrapping_add((part.len() as u64).wrapping_mul(8));
    }
    // Padding: a 1 bit, zeros, then the message length in bits in the block's last 8 bytes.
    block[used] = 0x80;
    block[used + 1..].fill(0);
    if used + 1 > 56 {
        compress(&mut state, &block);
        block.fill(0);
    }
    block[56..].copy_from_slice(&total_bits.to_be_bytes());
    compress(&mut state, &block);

    let mut digest = [0u8; 20];
    for (out, word) in digest.chunks_exact_mut(4).zip(state) {
        out.copy_from_slice(&word.to_be_bytes());
    }
    digest
}

/// Mixes one 64-byte block into `state` (FIPS 180-4 §6.1.2).
#[allow(
    clippy::many_single_char_names,
    reason = "the names of FIPS 180-4 §6.1.2, to check the code against it"
)]
fn compress(state: &mut [u32; 5], block: &[u8; 64]) {
    let mut w = [0u32; 80];
    for (i, bytes) in block.chunks_exact(4).enumerate() {
        w[i] = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    }
    for i in 16..80 {
        w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
    }
    let [mut a, mut b, mut c, mut d, mut e] = *state;
    for (i, &word) in w.iter().enumerate() {
        let (f, k) = match i {
            0..=19 => ((b & c) | (!b & d), 0x5a82_7999),
            20..=39 => (b ^ c ^ d, 0x6ed9_eba1),
            40..=59 => ((b & c) | (b & d) | (c & d), 0x8f1b_bcdc),
            _ => (b ^ c ^ d, 0xca62_c1d6),
        };
        let t = a
            .rotate_left(5)
            .wrapping_add(f)
            .wrapping_add(e)
            .wrapping_add(k)
            .wrapping_add(word);
        e = d;
        d = c;
        c = b.rotate_left(30);
        b = a;
        a = t;
    }
    for (s, v) in state.iter_mut().zip([a, b, c, d, e]) {
        *s = s.wrapping_add(v);
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write;

    use super::sha1;

    fn hex(digest: [u8; 20]) -> String {
        digest.iter().fold(String::new(), |mut s, b| {
            write!(s, "{b:02x}").expect("writing to a String");
            s
        })
    }

    #[test]
    fn fips_180_examples_and_padding_boundaries() {
        let million_a = vec![b'a'; 1_000_000];
        let a = |n| vec![b'a'; n];
        let cases: &[(&str, Vec<u8>, &str)] = &[
            ("empty", vec![], "da39a3ee5e6b4b0d3255bfef95601890afd80709"),
            ("abc (FIPS one block)", b"abc".to_vec(), "a9993e364706816aba3e25717850c26c9cd0d89d"),
            (
                "448 bits (FIPS two blocks)",
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".to_vec(),
                "84983e441c3bd26ebaae4aa1f95129e5e54670f1",
            ),
            (
                "896 bits",
                b"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu".to_vec(),
                "a49b2446a02c645bf419f995b67091253a04a259",
            ),
            ("one million a", million_a, "34aa973cd4c4daa4f61eeb2bdbad27316534016f"),
            // The length field fits after the 0x80 up to 55 bytes; from 56 it takes a new block.
            ("55 a", a(55), "c1c8bbdc22796e28c0e15163d20899b65621d65a"),
            ("56 a", a(56), "c2db330f6083854c99d4b5bfb6e8f29f201be699"),
            ("63 a", a(63), "03f09f5b158a7a8cdad920bddc29b81c18a551f5"),
            ("64 a", a(64), "0098ba824b5c16427bd7a1122a5a442a25ec644d"),
            ("65 a", a(65), "11655326c708d70319be2610e8a57d9a5b959d3b"),
            ("119 a", a(119), "ee971065aaa017e0632a8ca6c77bb3bf8b1dfc56"),
            ("120 a", a(120), "f34c1488385346a55709ba056ddd08280dd4c6d6"),
            ("128 a", a(128), "ad5b3fdbcb526778c2839d2f151ea753995e26a0"),
        ];
        for (name, input, want) in cases {
            assert_eq!(hex(sha1(&[input])), *want, "{name}");
            // Split into parts anywhere: the same digest.
            for cut in [0, 1, input.len() / 2, input.len()] {
                let (x, y) = input.split_at(cut.min(input.len()));
                assert_eq!(hex(sha1(&[x, y])), *want, "{name} cut at {cut}");
            }
        }
    }
}
