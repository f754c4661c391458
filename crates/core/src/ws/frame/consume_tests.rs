//! How much the decoder consumes and holds: the message size limit, incomplete headers, a large
//! message streaming through, and nothing after the close frame.

use super::tests::{
    close, close_frame, decode3, frame, pattern, text, BIG, BINARY, CONT, FIN, LEN_16, LEN_64,
    MASK, MASKED, PING, TEXT,
};
use super::*;

#[test]
fn messages_up_to_the_limit_pass_and_one_byte_more_is_1009() {
    let ok: &[(&str, usize, Vec<u8>, Event)] = &[
        (
            "exactly the limit",
            10,
            frame(FIN | BINARY, &[7; 10]),
            Event::Binary(vec![7; 10]),
        ),
        (
            "fragments summing to the limit",
            10,
            [frame(TEXT, b"hello"), frame(FIN | CONT, b"world")].concat(),
            text("helloworld"),
        ),
        (
            "empty message with limit 0",
            0,
            frame(FIN | TEXT, b""),
            text(""),
        ),
        (
            "control frames do not count",
            0,
            frame(FIN | PING, b"ping"),
            Event::Ping(b"ping".to_vec()),
        ),
    ];
    for (name, max, input, event) in ok {
        let got = decode3(*max, input);
        assert_eq!(got.events, vec![(input.len(), event.clone())], "{name}");
    }
    let too_big: &[(&str, usize, Vec<u8>, Vec<Event>)] = &[
        ("one byte over", 10, frame(FIN | BINARY, &[7; 11]), vec![]),
        ("one byte with limit 0", 0, frame(FIN | TEXT, b"x"), vec![]),
        (
            "fragments one byte over",
            10,
            [frame(TEXT, b"hello"), frame(FIN | CONT, b"world!")].concat(),
            vec![],
        ),
        (
            "over across fragments with a ping between",
            10,
            [
                frame(BINARY, b"hello"),
                frame(FIN | PING, b"p"),
                frame(CONT, b"world"),
                frame(FIN | CONT, b"!"),
            ]
            .concat(),
            vec![Event::Ping(b"p".to_vec())],
        ),
    ];
    for (name, max, input, events) in too_big {
        let got = decode3(*max, input);
        let seen: Vec<Event> = got.events.into_iter().map(|(_, e)| e).collect();
        assert_eq!((&seen, got.end), (events, Err(MESSAGE_TOO_BIG)), "{name}");
    }
}

#[test]
fn a_declared_length_over_the_limit_fails_before_any_payload() {
    // 64-bit length of 2^40, and not even the masking key yet.
    let head = [FIN | BINARY, MASKED | LEN_64, 0, 0, 1, 0, 0, 0, 0, 0];
    assert_eq!(Decoder::new(BIG).decode(&head), Err(MESSAGE_TOO_BIG));
    // A 16-bit length over the limit, likewise.
    assert_eq!(
        Decoder::new(1000).decode(&[FIN | TEXT, MASKED | LEN_16, 0x03, 0xe9]),
        Err(MESSAGE_TOO_BIG)
    );
}

#[test]
fn a_huge_declared_length_under_a_huge_limit_does_not_allocate_it_up_front() {
    // 2^62 bytes declared, allowed by the limit; the first payload bytes must not try to
    // allocate the whole frame (that fails) nor panic.
    let head = [FIN | BINARY, MASKED | LEN_64, 0x40, 0, 0, 0, 0, 0, 0, 0];
    let input = [&head[..], &MASK, b"abcd"].concat();
    let mut decoder = Decoder::new(usize::MAX);
    assert_eq!(decoder.decode(&input), Ok((input.len(), None)));
    assert_eq!(decoder.decode(b"more"), Ok((4, None)));
}

#[test]
fn a_header_is_consumed_only_when_complete_and_payload_as_it_arrives() {
    let input = frame(FIN | BINARY, &pattern(65536));
    for len in 0..14 {
        let mut decoder = Decoder::new(BIG);
        assert_eq!(
            decoder.decode(&input[..len]),
            Ok((0, None)),
            "header prefix of {len}"
        );
    }
    let mut decoder = Decoder::new(BIG);
    assert_eq!(decoder.decode(&input[..14]), Ok((14, None)));
    assert_eq!(decoder.decode(&input[14..114]), Ok((100, None)));
    assert_eq!(decoder.decode(&[]), Ok((0, None)));
    assert_eq!(
        decoder.decode(&input[114..]),
        Ok((input.len() - 114, Some(Event::Binary(pattern(65536)))))
    );
}

#[test]
fn a_large_message_streams_through_without_the_caller_buffering_it() {
    let payload = pattern(3 << 20);
    let input = frame(FIN | BINARY, &payload);
    let mut decoder = Decoder::new(4 << 20);
    let mut pending = Vec::new();
    let mut got = None;
    for read in input.chunks(65536) {
        pending.extend_from_slice(read);
        loop {
            let (n, event) = decoder.decode(&pending).expect("valid");
            pending.drain(..n);
            got = got.or(event);
            if n == 0 {
                break;
            }
        }
        assert!(
            pending.len() < 14,
            "the caller holds {} bytes",
            pending.len()
        );
    }
    assert_eq!(got, Some(Event::Binary(payload)));
}

#[test]
fn nothing_is_consumed_after_the_close_frame() {
    let close_bytes = close_frame(1000, b"done");
    let input = [
        close_bytes.clone(),
        frame(FIN | TEXT, b"late"),
        vec![0xff; 20],
    ]
    .concat();
    let mut decoder = Decoder::new(BIG);
    assert_eq!(
        decoder.decode(&input),
        Ok((close_bytes.len(), Some(close(1000, "done"))))
    );
    assert_eq!(decoder.decode(&input[close_bytes.len()..]), Ok((0, None)));
    assert_eq!(decoder.decode(&[0xff; 4]), Ok((0, None)));
}
