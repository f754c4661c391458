//! Invariant: the WebSocket `Decoder` decodes, asks for more, or returns a protocol error (1002,
//! 1007, 1009); it never panics, and never loops without consuming (a call that returns no event
//! either consumes or answers `(0, None)`); and the events, the bytes consumed and the error are
//! the same whether the input arrives whole or in pieces.
//!
//! Input: byte 0 picks the largest piece size for the split feed (low 4 bits) and the message
//! size limit (high bits); the rest is the client's byte stream after the upgrade.
#![no_main]

use ferroloop_core::ws::{Decoder, Event, ProtocolError};
use libfuzzer_sys::fuzz_target;

/// Small limits so that inputs cross them, and the server's default (16 MiB).
const MAX_MESSAGE: [usize; 4] = [0, 16, 1000, 16 << 20];

fn decode(input: &[u8], max: usize, piece: usize) -> (Vec<Event>, Result<usize, ProtocolError>) {
    let mut decoder = Decoder::new(max);
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
    let whole = decode(input, max, input.len().max(1));
    let pieces = decode(input, max, usize::from(*pick % 16) + 1);
    assert_eq!(whole, pieces);
    match whole {
        (events, Ok(consumed)) => {
            assert!(consumed <= input.len());
            for event in events {
                if let Event::Text(text) = event {
                    assert!(std::str::from_utf8(&text).is_ok());
                }
            }
        }
        (_, Err(err)) => {
            assert!([1002, 1007, 1009].contains(&err.code), "{err:?}");
            assert!(err.reason.len() <= 123);
        }
    }
});
