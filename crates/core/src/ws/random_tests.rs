//! Deterministic randomized tests of the frame [`Decoder`]. Random valid conversations (messages
//! cut into fragments at random bytes, control frames between fragments, random masking keys,
//! and with permessage-deflate most messages compressed by a client-side [`Compressor`]), split
//! into reads at random points, decode to exactly what was sent. Random and mutated streams (the
//! fuzz target's invariant) never panic or stall, and give the same events and the same error
//! however they are split.

use super::deflate::{Compressor, DeflateParams};
use super::frame::{encode_head, Decoder, Event, Opcode, ProtocolError, MAX_HEAD_LEN};

use crate::test_rng::Rng;

/// Characters of 1 to 4 bytes, so fragment cuts land inside them.
const CHARS: &[char] = &[
    'a',
    'Z',
    ' ',
    '\0',
    '\u{7f}',
    '\u{80}',
    'é',
    'ß',
    '€',
    '中',
    '\u{ffff}',
    '𝄞',
    '😀',
    '\u{10ffff}',
];

/// The decoder's extension: none, permessage-deflate with the client's context kept across
/// messages, or reset after each.
const DEFLATE: [Option<DeflateParams>; 3] = [
    None,
    Some(DeflateParams {
        server_no_context_takeover: false,
        client_no_context_takeover: false,
        server_max_window_bits: None,
        client_max_window_bits: None,
    }),
    Some(DeflateParams {
        server_no_context_takeover: false,
        client_no_context_takeover: true,
        server_max_window_bits: None,
        client_max_window_bits: None,
    }),
];

const CLOSE_CODES: &[u16] = &[
    1000, 1001, 1002, 1003, 1007, 1009, 1011, 1012, 1014, 3000, 4999,
];

fn random_text(rng: &mut Rng, max_bytes: usize) -> String {
    let mut s = String::new();
    loop {
        let c = CHARS[rng.below(CHARS.len())];
        if s.len() + c.len_utf8() > max_bytes {
            return s;
        }
        s.push(c);
    }
}

/// A payload length: mostly short, sometimes past the 16-bit and 64-bit length thresholds.
fn random_len(rng: &mut Rng) -> usize {
    match rng.below(10) {
        0 => 126 + rng.below(300),
        1 => 65_000 + rng.below(1_000),
        _ => rng.below(40),
    }
}

/// One client frame, masked with a random key.
fn client_frame(rng: &mut Rng, opcode: Opcode, fin: bool, payload: &[u8], out: &mut Vec<u8>) {
    let mut head = [0; MAX_HEAD_LEN];
    let n = encode_head(opcode, fin, payload.len(), &mut head);
    head[1] |= 0x80;
    let key = [
        rng.next() as u8,
        rng.next() as u8,
        rng.next() as u8,
        rng.next() as u8,
    ];
    out.extend_from_slice(&head[..n]);
    out.extend_from_slice(&key);
    out.extend(payload.iter().zip(key.iter().cycle()).map(|(b, k)| b ^ k));
}

/// A ping or a pong with a random payload of at most 125 bytes.
fn control(rng: &mut Rng, out: &mut Vec<u8>, events: &mut Vec<Event>) {
    let len = rng.below(126);
    let payload = rng.bytes(len);
    if rng.below(2) == 0 {
        client_frame(rng, Opcode::Ping, true, &payload, out);
        events.push(Event::Ping(payload));
    } else {
        client_frame(rng, Opcode::Pong, true, &payload, out);
        events.push(Event::Pong(payload));
    }
}

/// A data message cut into 1 to 4 fragments at random bytes, with control frames between them.
/// With a `compressor` (the client's), three messages in four go compressed.
fn message(
    rng: &mut Rng,
    out: &mut Vec<u8>,
    events: &mut Vec<Event>,
    compressor: Option<&mut Compressor>,
) {
    let (opcode, data, event) = if rng.below(2) == 0 {
        let len = random_len(rng);
        let text = random_text(rng, len);
        let data = text.clone().into_bytes();
        (Opcode::Text, data, Event::Text(text.into_bytes()))
    } else {
        let len = random_len(rng);
        let data = rng.bytes(len);
        (Opcode::Binary, data.clone(), Event::Binary(data))
    };
    let (data, compressed) = match compressor {
        Some(compressor) if rng.below(4) != 0 => {
            let mut payload = Vec::new();
            compressor.compress(&data, &mut payload);
            (payload, true)
        }
        _ => (data, false),
    };
    let count = rng.below(4);
    let mut cuts: Vec<usize> = (0..count).map(|_| rng.below(data.len() + 1)).collect();
    cuts.sort_unstable();
    cuts.push(data.len());
    let mut start = 0;
    for (i, &end) in cuts.iter().enumerate() {
        let first = i == 0;
        let last = i + 1 == cuts.len();
        let op = if first { opcode } else { Opcode::Continuation };
        let head = out.len();
        client_frame(rng, op, last, &data[start..end], out);
        if first && compressed {
            out[head] |= 0x40;
        }
        start = end;
        if !last && rng.below(3) == 0 {
            control(rng, out, events);
        }
    }
    events.push(event);
}

/// A random valid conversation with a decoder that negotiated `deflate`: its client byte stream
/// and the events it must decode to.
fn conversation(rng: &mut Rng, deflate: Option<&DeflateParams>) -> (Vec<u8>, Vec<Event>) {
    let (mut out, mut events) = (Vec::new(), Vec::new());
    // The client's compressor keeps its context unless it promised not to.
    let mut compressor = deflate.map(|params| {
        Compressor::new(&DeflateParams {
            server_no_context_takeover: params.client_no_context_takeover,
            ..*params
        })
    });
    let count = rng.below(6);
    for _ in 0..count {
        if rng.below(4) == 0 {
            control(rng, &mut out, &mut events);
        } else {
            message(rng, &mut out, &mut events, compressor.as_mut());
        }
    }
    match rng.below(3) {
        0 => {
            let code = CLOSE_CODES[rng.below(CLOSE_CODES.len())];
            let len = rng.below(124);
            let reason = random_text(rng, len);
            let payload = [&code.to_be_bytes()[..], reason.as_bytes()].concat();
            client_frame(rng, Opcode::Close, true, &payload, &mut out);
            events.push(Event::Close {
                code: Some(code),
                reason,
            });
        }
        1 => {
            client_frame(rng, Opcode::Close, true, &[], &mut out);
            events.push(Event::Close {
                code: None,
                reason: String::new(),
            });
        }
        _ => {}
    }
    (out, events)
}

/// Events and the end of decoding (consumed total or the error).
type Outcome = (Vec<Event>, Result<usize, ProtocolError>);

/// Decodes `input` in reads of 1 to `max_read` bytes, as the connection layer does, with a
/// decoder that negotiated `deflate`. Each call must consume, yield an event, or stop: more calls
/// than that would be a loop.
fn decode_in_reads(
    rng: &mut Rng,
    (max, deflate): (usize, Option<&DeflateParams>),
    input: &[u8],
    max_read: usize,
) -> Outcome {
    let mut decoder = match deflate {
        Some(params) => Decoder::with_deflate(max, params),
        None => Decoder::new(max),
    };
    let (mut events, mut consumed, mut offered, mut calls) = (Vec::new(), 0, 0, 0);
    while offered < input.len() {
        offered = (offered + 1 + rng.below(max_read)).min(input.len());
        loop {
            calls += 1;
            assert!(
                calls <= 2 * input.len() + 2,
                "decoder loops on {input:02x?}"
            );
            let (n, event) = match decoder.decode(&input[consumed..offered]) {
                Ok(step) => step,
                Err(err) => return (events, Err(err)),
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

#[test]
fn random_conversations_split_anywhere_decode_to_what_was_sent() {
    let mut rng = Rng(0x5eed_0fc0_ffee_1234);
    let mut frames = 0;
    for round in 0..2_400 {
        let deflate = DEFLATE[round % 3].as_ref();
        let (input, events) = conversation(&mut rng, deflate);
        let max_read = [1, 3, 100, 5_000, usize::MAX - 1][round % 5];
        let (got, end) = decode_in_reads(&mut rng, (1 << 17, deflate), &input, max_read);
        assert_eq!(end, Ok(input.len()), "round {round}");
        assert_eq!(got, events, "round {round}");
        frames += events.len();
    }
    assert!(frames > 8_000, "{frames}");
}

/// Bytes that matter to the frame grammar: FIN and opcodes, MASK with lengths 125-127.
const INTERESTING: &[u8] = &[
    0x00, 0x01, 0x02, 0x08, 0x09, 0x0a, 0x80, 0x81, 0x82, 0x88, 0x89, 0xfd, 0xfe, 0xff, 0xc1, 0xc2,
    0x41, 0xc9,
];

fn mutate(rng: &mut Rng, input: &mut Vec<u8>) {
    for _ in 0..=rng.below(3) {
        let at = rng.below(input.len() + 1);
        match rng.below(5) {
            0 if at < input.len() => input[at] ^= 1 << rng.below(8),
            1 => input.insert(at, INTERESTING[rng.below(INTERESTING.len())]),
            2 if at < input.len() => {
                input.remove(at);
            }
            3 => input.truncate(at),
            _ if at < input.len() => input[at] = rng.next() as u8,
            _ => {}
        }
    }
}

#[test]
fn random_streams_never_panic_and_do_not_depend_on_the_split() {
    let mut rng = Rng(0x0bad_5eed_dead_beef);
    // Outcomes seen: complete, incomplete, each close code, and corrupt deflate data.
    let (mut ok, mut codes, mut corrupt) = (0, [0usize; 3], 0);
    for round in 0..6_000 {
        let deflate = DEFLATE[(round / 3) % 3].as_ref();
        let input = if round % 3 == 0 {
            let len = rng.below(64);
            let mut input = rng.bytes(len);
            if let Some(first) = input.first_mut() {
                *first = INTERESTING[rng.below(INTERESTING.len())];
            }
            input
        } else {
            let (mut input, _) = conversation(&mut rng, deflate);
            input.truncate(4_096);
            mutate(&mut rng, &mut input);
            input
        };
        let max = [0, 16, 1_000, 1 << 20][rng.below(4)];
        let whole = decode_in_reads(&mut rng, (max, deflate), &input, usize::MAX - 1);
        let max_read = 1 + rng.below(8);
        let pieces = decode_in_reads(&mut rng, (max, deflate), &input, max_read);
        assert_eq!(whole, pieces, "{input:02x?}");
        match whole.1 {
            Ok(_) => ok += 1,
            Err(err) => {
                corrupt += usize::from(err.reason.contains("inflated"));
                let slot = [1002, 1007, 1009].iter().position(|&c| c == err.code);
                codes[slot.unwrap_or_else(|| panic!("unexpected close code: {err}"))] += 1;
            }
        }
    }
    assert!(
        ok > 500 && codes.iter().all(|&n| n > 100) && corrupt > 50,
        "{ok} ok, {codes:?}, {corrupt} not inflated"
    );
}
