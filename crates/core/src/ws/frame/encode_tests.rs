//! The encoding side (server frame headers, close payloads, unmasking), and round trips of what
//! it builds through the decoder.

use super::tests::{close, frame, pattern, BIG, CLOSE, FIN, MASK};
use super::*;

#[test]
fn unmask_matches_bytewise_xor_at_every_length_and_phase() {
    for len in 0..40 {
        for phase in 0..4 {
            let mut mask = MASK;
            mask.rotate_left(phase);
            let mut data = pattern(len);
            unmask(&mut data, mask);
            let want: Vec<u8> = pattern(len)
                .iter()
                .zip(mask.iter().cycle())
                .map(|(b, k)| b ^ k)
                .collect();
            assert_eq!(data, want, "len {len} phase {phase}");
        }
    }
}

#[test]
fn encode_head_uses_the_shortest_length() {
    let cases: &[(Opcode, bool, usize, &[u8])] = &[
        (Opcode::Binary, true, 0, &[0x82, 0]),
        (Opcode::Binary, true, 125, &[0x82, 125]),
        (Opcode::Binary, true, 126, &[0x82, 126, 0, 126]),
        // RFC 6455 §5.7: 256 bytes in a single unmasked frame.
        (Opcode::Binary, true, 256, &[0x82, 0x7e, 0x01, 0x00]),
        (Opcode::Text, true, 65535, &[0x81, 126, 0xff, 0xff]),
        // RFC 6455 §5.7: 64 KiB in a single unmasked frame.
        (
            Opcode::Binary,
            true,
            65536,
            &[0x82, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0],
        ),
        (Opcode::Text, false, 3, &[0x01, 3]),
        (Opcode::Continuation, true, 2, &[0x80, 2]),
        (Opcode::Close, true, 2, &[0x88, 2]),
        (Opcode::Ping, true, 5, &[0x89, 5]),
        (Opcode::Pong, true, 5, &[0x8a, 5]),
        (
            Opcode::Binary,
            true,
            1 << 40,
            &[0x82, 127, 0, 0, 1, 0, 0, 0, 0, 0],
        ),
    ];
    for &(opcode, fin, len, want) in cases {
        let mut out = [0; MAX_HEAD_LEN];
        let n = encode_head(opcode, fin, len, &mut out);
        assert_eq!(&out[..n], want, "{opcode:?} {fin} {len}");
    }
}

#[test]
fn encoded_frames_masked_like_a_client_decode_to_their_payload() {
    for len in [0, 1, 7, 8, 125, 126, 127, 65535, 65536, 70_001] {
        for opcode in [Opcode::Text, Opcode::Binary, Opcode::Ping, Opcode::Pong] {
            if opcode.is_control() && len > 125 {
                continue;
            }
            let payload: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let mut head = [0; MAX_HEAD_LEN];
            let n = encode_head(opcode, true, len, &mut head);
            // Mask it as a client would: set MASK, insert the key, XOR the payload.
            let mut wire = head[..n].to_vec();
            wire[1] |= 0x80;
            wire.extend_from_slice(&MASK);
            wire.extend(payload.iter().zip(MASK.iter().cycle()).map(|(b, k)| b ^ k));
            let want = match opcode {
                Opcode::Text => Event::Text(payload),
                Opcode::Binary => Event::Binary(payload),
                Opcode::Ping => Event::Ping(payload),
                _ => Event::Pong(payload),
            };
            let got = Decoder::new(BIG).decode(&wire);
            assert_eq!(got, Ok((wire.len(), Some(want))), "{opcode:?} {len}");
        }
    }
}

#[test]
fn close_payload_cuts_the_reason_at_a_character_boundary() {
    let e62 = "é".repeat(62); // 124 bytes
    let clef31 = "𝄞".repeat(31); // 124 bytes
    let cases: &[(&[u8], &[u8])] = &[
        (b"", b""),
        (b"bye", b"bye"),
        (&[b'a'; 123], &[b'a'; 123]),
        (&[b'a'; 124], &[b'a'; 123]),
        (&[b'a'; 1000], &[b'a'; 123]),
        (e62.as_bytes(), &e62.as_bytes()[..122]),
        (clef31.as_bytes(), &clef31.as_bytes()[..120]),
        // Not UTF-8 at all: only whole-byte cuts, and no underflow.
        (&[0x80; 200], &[]),
    ];
    for &(reason, want) in cases {
        let payload = close_payload(1000, reason);
        assert_eq!(&payload[..2], &[0x03, 0xe8]);
        assert_eq!(&payload[2..], want, "{:?}", String::from_utf8_lossy(reason));
    }
    // What it builds decodes back.
    let payload = close_payload(4000, e62.as_bytes());
    let input = frame(FIN | CLOSE, &payload);
    let got = Decoder::new(0).decode(&input);
    assert_eq!(got, Ok((input.len(), Some(close(4000, &"é".repeat(61))))));
}

#[test]
fn error_reasons_fit_a_close_frame_and_name_the_cause() {
    for err in [
        RESERVED_BITS,
        RESERVED_OPCODE,
        FRAGMENTED_CONTROL,
        CONTINUATION_WITHOUT_MESSAGE,
        MESSAGE_INTERRUPTED,
        UNMASKED,
        CONTROL_TOO_LONG,
        LENGTH_HIGH_BIT,
        MESSAGE_TOO_BIG,
        BAD_TEXT,
        CLOSE_ONE_BYTE,
        BAD_CLOSE_CODE,
        BAD_CLOSE_REASON,
    ] {
        assert!([1002, 1007, 1009].contains(&err.code), "{err}");
        assert!(!err.reason.is_empty() && err.reason.len() <= 123, "{err}");
        assert_eq!(
            close_payload(err.code, err.reason.as_bytes()).len(),
            2 + err.reason.len()
        );
    }
}
