//! Invariant: a whole conversation through the HTTP/1.1 server connection (`http::conn`, played
//! by its reference driver `http::conn::replay`: requests of any framing, pipelined, with
//! `Expect: 100-continue`, upgrades, a half-close, small limits) never panics (a transition
//! outside the connection's table panics in this debug build) or hangs, and its transcript (the
//! events, the bytes written, the last phase) is the same whether the bytes arrive whole or in
//! pieces.
//!
//! Input: byte 0's low four bits are the piece size for the split feed, bit 4 makes the client
//! half-close after its last byte, bit 5 picks small limits (a 48-byte head, 2 fields, a 6-byte
//! body); the rest is what the client sends. `dicts/conversation.dict` holds request tokens.
#![no_main]

use ferroloop_core::http::conn::replay::{replay, Play};
use ferroloop_core::http::conn::{Phase, Settings};
use ferroloop_core::http::Limits;
use libfuzzer_sys::fuzz_target;

const SMALL: Settings = Settings {
    limits: Limits {
        max_head_bytes: 48,
        max_headers: 2,
        max_uri_bytes: 8,
    },
    limit_body: Some(6),
    timeout_header: 5.0,
    timeout_keep_alive: 5.0,
};

fuzz_target!(|data: &[u8]| {
    let [pick, input @ ..] = data else { return };
    let settings = if pick & 0x20 == 0 {
        Settings::default()
    } else {
        SMALL
    };
    let play = Play {
        piece: input.len().max(1),
        half_close: pick & 0x10 != 0,
        settings,
    };
    let whole = replay(input, play);
    let split = replay(
        input,
        Play {
            piece: usize::from(*pick % 16) + 1,
            ..play
        },
    );
    assert_eq!(whole.events, split.events);
    assert_eq!(whole.output, split.output);
    assert_eq!(whole.phase, split.phase);
    if play.half_close {
        assert!(matches!(whole.phase, Some(Phase::Lingering | Phase::Closed)));
    }
});
