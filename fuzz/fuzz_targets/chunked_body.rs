//! Invariant: the chunked `BodyDecoder` decodes, asks for more, or returns a protocol error (400,
//! 431); it never panics or loops; it never consumes past the end of the body; and the body,
//! the bytes consumed and the answer are the same whether the input arrives whole or in pieces.
//!
//! Input: byte 0's low four bits are the largest piece size for the split feed, its bit 4 picks
//! small head limits (which the trailer section gets too) instead of the defaults; the rest is
//! the body's framing. `dicts/chunked_body.dict` holds its tokens and malformed trailer lines.
#![no_main]

use ferroloop_core::http::{BodyDecoder, BodyKind, HttpError, Limits};
use libfuzzer_sys::fuzz_target;

const SMALL: Limits = Limits {
    max_head_bytes: 64,
    max_headers: 4,
    max_uri_bytes: 32,
};

fn decode(
    input: &[u8],
    limits: &Limits,
    piece: usize,
) -> Result<(Vec<u8>, usize, bool), HttpError> {
    let mut decoder = BodyDecoder::new(BodyKind::Chunked, limits);
    let (mut body, mut consumed, mut offered) = (Vec::new(), 0, 0);
    while offered < input.len() && !decoder.is_done() {
        offered = (offered + piece).min(input.len());
        let mut calls = 0;
        loop {
            calls += 1;
            assert!(calls <= input.len() + 2, "decoder loops");
            let d = decoder.decode(&input[consumed..offered])?;
            assert!(d.data.start <= d.data.end && d.data.end <= d.consumed);
            assert!(
                d.consumed > 0 || d.done || consumed == offered,
                "stalled with input"
            );
            body.extend_from_slice(&input[consumed..][d.data]);
            consumed += d.consumed;
            if d.done || d.consumed == 0 {
                break;
            }
        }
    }
    Ok((body, consumed, decoder.is_done()))
}

fuzz_target!(|data: &[u8]| {
    let [pick, input @ ..] = data else { return };
    let limits = if pick & 0x10 == 0 {
        Limits::default()
    } else {
        SMALL
    };
    let whole = decode(input, &limits, input.len().max(1));
    let pieces = decode(input, &limits, usize::from(*pick % 16) + 1);
    assert_eq!(whole, pieces);
    match whole {
        Ok((body, consumed, done)) => {
            assert!(body.len() <= consumed && consumed <= input.len());
            assert!(done || consumed == input.len());
        }
        Err(err) => assert!([400, 431].contains(&err.status), "{err:?}"),
    }
});
