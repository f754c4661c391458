//! Deterministic randomized conversations (the fuzz target `conversation`'s driver, run in
//! `cargo test`): requests of every framing, pipelined, with `Expect: 100-continue`, upgrades,
//! malformed and mutated bytes, small limits and a half-close, played in random pieces.
//! Invariant: nothing panics (a transition outside the table panics in test builds) or hangs,
//! and the transcript is the same however the bytes are split.

use super::replay::{replay, Play};
use super::{Phase, Settings};
use crate::http::Limits;
use crate::test_rng::Rng;

const REQUESTS: &[&[u8]] = &[
    b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET /a?b=c HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
    b"PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
    b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nT: 1\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n1;e\r\nx\r\n0\r\n\r\n",
    b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    b"GET / HTTP/9.9\r\n\r\n",
];

const INTERESTING: &[u8] = b"\r\n :;0159aF/HTTP.-\0\xff";

fn conversation(rng: &mut Rng) -> Vec<u8> {
    let mut input = Vec::new();
    for _ in 0..=rng.below(4) {
        input.extend_from_slice(REQUESTS[rng.below(REQUESTS.len())]);
    }
    for _ in 0..rng.below(3) {
        let at = rng.below(input.len() + 1);
        match rng.below(4) {
            0 if at < input.len() => input[at] = INTERESTING[rng.below(INTERESTING.len())],
            1 => input.insert(at, INTERESTING[rng.below(INTERESTING.len())]),
            2 if at < input.len() => {
                input.remove(at);
            }
            _ => input.truncate(at),
        }
    }
    input
}

fn settings(rng: &mut Rng) -> Settings {
    if rng.below(3) == 0 {
        Settings {
            limits: Limits {
                max_head_bytes: 40 + rng.below(40),
                max_headers: 1 + rng.below(4),
                max_uri_bytes: 2 + rng.below(10),
            },
            limit_body: Some(rng.below(8) as u64),
            ..Settings::default()
        }
    } else {
        Settings::default()
    }
}

#[test]
fn random_conversations_do_not_depend_on_how_bytes_are_split() {
    let mut rng = Rng(0x5eed_c0de_1234_5678);
    for round in 0..4000 {
        let input = conversation(&mut rng);
        let play = Play {
            piece: input.len().max(1),
            half_close: rng.below(2) == 0,
            settings: settings(&mut rng),
        };
        let whole = replay(&input, play);
        let piece = 1 + rng.below(9);
        let split = replay(&input, Play { piece, ..play });
        assert_eq!(
            whole.events, split.events,
            "round {round}: {input:?}, pieces of {piece}"
        );
        assert_eq!(whole.output, split.output, "round {round}: {input:?}");
        assert_eq!(whole.phase, split.phase, "round {round}: {input:?}");
        // The connection ends open only if the client has not finished.
        if play.half_close {
            let ended = matches!(whole.phase, Some(Phase::Lingering | Phase::Closed));
            assert!(ended, "round {round}: {input:?}");
        }
    }
}
