//! Invariant: the WebSocket `Decoder` decodes, asks for more, or returns a protocol error (1002,
//! 1007, 1009); it never panics, and never loops without consuming (a call that returns no event
//! either consumes or answers `(0, None)`); no message is longer than the limit, even inflated;
//! and the events, the bytes consumed and the error are the same whether the input arrives whole
//! or in pieces.
//!
//! Input: byte 0 picks the largest piece size for the split feed (low 4 bits), the message size
//! limit (bits 4-5) and the extension (bits 6-7: none, or permessage-deflate with the client's
//! context kept or reset per message); the rest is the client's byte stream after the upgrade.
#![no_main]

use ferroloop_core::ws::{Decoder, DeflateParams, Event, ProtocolError};
use libfuzzer_sys::fuzz_target;

/// Small limits so that inputs cross them, and the server's default (16 MiB).
const MAX_MESSAGE: [usize; 4] = [0, 16, 1000, 16 << 20];

/// A decoder with no extension (`mode` 0 or 3), or with permessage-deflate, the client's context
/// kept (1) or reset per message (2).
fn decoder(max: usize, mode: u8) -> Decoder {
    let params = DeflateParams {
        server_no_context_takeover: false,
        client_no_context_takeover: mode == 2,
        server_max_window_bits: None,
        client_max_window_bits: None,
    };
    match mode {
        1 | 2 => Decoder::with_deflate(max, &params),
        _ => Decoder::new(max),
    }
}

fn decode(
    mut decoder: Decoder,
    input: &[u8],
    piece: usize,
) -> (Vec<Event>, Result<usize, ProtocolError>) {
    let (mut events, mut consumed, mut offered, mut calls) = (Vec::new(), 0, 0, 0);
    while offered < input.len() {
        offered = (offered + piece).min(input.len());
        loop {
            calls += 1;
            assert!(calls <= 2 * input.len() + 2, "decoder loops");
            let (n, event) = match decoder.decode(&input[consumed..offered]) {
                Ok(step) => step,
                Err(err) => {
                    assert_eq!(decoder.decode(&input[consumed..offered]), Err(err));
                    return (events, Err(err));
                }
            };
            consumed += n;
            assert!(consumed <= offered);
            match event {
                Some(event) => events.push(event),
                None if n == 0 => break,
                None => {}
            }
        }
    }
    (events, Ok(consumed))
}

fuzz_target!(|data: &[u8]| {
    let [pick, input @ ..] = data else { return };
    let max = MAX_MESSAGE[usize::from(*pick >> 4) % MAX_MESSAGE.len()];
    let mode = *pick >> 6;
    let whole = decode(decoder(max, mode), input, input.len().max(1));
    let pieces = decode(decoder(max, mode), input, usize::from(*pick % 16) + 1);
    assert_eq!(whole, pieces);
    match whole {
        (events, Ok(consumed)) => {
            assert!(consumed <= input.len());
            for event in events {
                match event {
                    Event::Text(text) => {
                        assert!(text.len() <= max);
                        assert!(std::str::from_utf8(&text).is_ok());
                    }
                    Event::Binary(data) => assert!(data.len() <= max),
                    _ => {}
                }
            }
        }
        (_, Err(err)) => {
            assert!([1002, 1007, 1009].contains(&err.code), "{err:?}");
            assert!(err.reason.len() <= 123);
        }
    }
});
