//! Deterministic randomized tests: ~20k random and mutated inputs through `parse_head` and the
//! chunked `BodyDecoder`. Invariant (the same as the fuzz targets'): each input parses or returns
//! a protocol error; nothing panics or loops; and splitting the input never changes the answer.

use super::{parse_head, BodyDecoder, BodyKind, Head, HttpError, Limits};

use crate::test_rng::Rng;

const HEAD_SEEDS: &[&[u8]] = &[
    b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"POST /p?q=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello",
    b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive, close\r\n\r\n",
    b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\nContent-Length: 1, 1\r\n\r\n",
    b"\r\nOPTIONS * HTTP/1.1\nX: y\n\n",
];

const BODY_SEEDS: &[&[u8]] = &[
    b"5\r\nhello\r\n0\r\n\r\n",
    b"3;a=b\r\nabc\r\nA \r\n0123456789\r\n0;x\r\nT: 1\r\nU: 2\r\n\r\n",
    b"0\r\n\r\n",
];

/// Bytes that matter to the grammars, to make random edits land on interesting cases.
const INTERESTING: &[u8] = b"\r\n \t:;,0159afAF/?HTTP.-\0\x7f\xff";

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut input = seed.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(input.len() + 1);
        match rng.below(6) {
            0 if at < input.len() => input[at] = INTERESTING[rng.below(INTERESTING.len())],
            1 => input.insert(at, INTERESTING[rng.below(INTERESTING.len())]),
            2 if at < input.len() => {
                input.remove(at);
            }
            3 => input.truncate(at),
            4 => {
                // Duplicate a slice (repeated fields, repeated chunks).
                let end = (at + rng.below(40)).min(input.len());
                let piece = input[at..end].to_vec();
                input.splice(at..at, piece);
            }
            _ if at < input.len() => input[at] = rng.next() as u8,
            _ => {}
        }
    }
    input
}

fn random_bytes(rng: &mut Rng) -> Vec<u8> {
    let len = rng.below(120);
    (0..len)
        .map(|_| {
            if rng.below(3) == 0 {
                rng.next() as u8
            } else {
                INTERESTING[rng.below(INTERESTING.len())]
            }
        })
        .collect()
}

fn input(rng: &mut Rng, seeds: &[&[u8]]) -> Vec<u8> {
    if rng.below(4) == 0 {
        random_bytes(rng)
    } else {
        let seed = seeds[rng.below(seeds.len())];
        mutate(rng, seed)
    }
}

fn check_head(input: &[u8], limits: &Limits, head: &mut Head) -> Result<Option<usize>, HttpError> {
    let mut buf = input.to_vec();
    match parse_head(&mut buf, limits, head) {
        Ok(true) => {
            assert!(head.head_len <= buf.len() && head.head_len <= limits.max_head_bytes);
            for range in [&head.method, &head.target, &head.path, &head.query] {
                assert!(
                    range.start <= range.end && range.end <= head.head_len,
                    "{range:?}"
                );
            }
            assert!(head.target.end - head.target.start <= limits.max_uri_bytes);
            assert!(head.headers.len() <= limits.max_headers);
            for (name, value) in &head.headers {
                assert!(name.end <= head.head_len && value.end <= head.head_len);
                assert!(!buf[name.clone()].iter().any(u8::is_ascii_uppercase));
            }
            assert_eq!(
                buf[head.head_len..],
                input[head.head_len..],
                "past the head changed"
            );
            Ok(Some(head.head_len))
        }
        Ok(false) => Ok(None),
        Err(err) => {
            assert!([400, 414, 431, 501, 505].contains(&err.status), "{err:?}");
            Err(err)
        }
    }
}

#[test]
fn random_heads_never_panic_and_do_not_depend_on_the_split() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Limits small enough that inputs cross them, with errors on both sides of the cut.
    let small_head = Limits {
        max_head_bytes: 40,
        max_headers: 4,
        max_uri_bytes: 24,
    };
    let small_uri = Limits {
        max_head_bytes: 200,
        max_headers: 2,
        max_uri_bytes: 4,
    };
    let mut head = Head::default();
    let mut outcomes = [0usize; 3];
    for _ in 0..8_000 {
        let input = input(&mut rng, HEAD_SEEDS);
        for limits in [&Limits::default(), &small_head, &small_uri] {
            let whole = check_head(&input, limits, &mut head);
            outcomes[match whole {
                Ok(Some(_)) => 0,
                Ok(None) => 1,
                Err(_) => 2,
            }] += 1;
            // A prefix that already answered must give the whole input's answer.
            let split = rng.below(input.len() + 1);
            let prefix = check_head(&input[..split], limits, &mut head);
            if prefix != Ok(None) {
                assert_eq!(
                    prefix,
                    whole,
                    "split at {split}: {:?}",
                    String::from_utf8_lossy(&input)
                );
            }
        }
    }
    // The generator reaches all three outcomes often.
    assert!(outcomes.iter().all(|&n| n > 1000), "{outcomes:?}");
}

/// Decodes `input` in pieces of random sizes; returns (body, consumed, done) or the error.
fn decode_in_pieces(
    rng: &mut Rng,
    input: &[u8],
    max_piece: usize,
) -> Result<(Vec<u8>, usize, bool), HttpError> {
    let mut decoder = BodyDecoder::new(BodyKind::Chunked, &Limits::default());
    let (mut body, mut consumed, mut offered) = (Vec::new(), 0, 0);
    while offered < input.len() && !decoder.is_done() {
        offered = (offered + 1 + rng.below(max_piece)).min(input.len());
        // Each call consumes or stops; more calls than bytes would mean a loop.
        for calls in 0.. {
            assert!(calls <= input.len() + 1, "decoder loops on {input:?}");
            let d = decoder.decode(&input[consumed..offered])?;
            body.extend_from_slice(&input[consumed..][d.data]);
            consumed += d.consumed;
            if d.done || d.consumed == 0 {
                break;
            }
        }
    }
    Ok((body, consumed, decoder.is_done()))
}

#[test]
fn random_chunked_bodies_never_panic_and_do_not_depend_on_the_split() {
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let mut outcomes = [0usize; 3];
    for _ in 0..8_000 {
        let input = input(&mut rng, BODY_SEEDS);
        let whole = decode_in_pieces(&mut rng, &input, usize::MAX - 1);
        let pieces = decode_in_pieces(&mut rng, &input, 4);
        assert_eq!(whole, pieces, "{:?}", String::from_utf8_lossy(&input));
        match whole {
            Ok((_, consumed, true)) => {
                assert!(consumed <= input.len());
                outcomes[0] += 1;
            }
            Ok((_, consumed, false)) => {
                assert_eq!(consumed, input.len());
                outcomes[1] += 1;
            }
            Err(err) => {
                assert!([400, 431].contains(&err.status), "{err:?}");
                outcomes[2] += 1;
            }
        }
    }
    assert!(outcomes.iter().all(|&n| n > 500), "{outcomes:?}");
}
