//! Runner protocol messages: the sidecar's `runner::read_message` over a byte stream (the
//! runner's socket), and both message types' JSON forms.
//!
//! Input: two bytes choosing the read buffer's size, one byte of padding (×600 spaces, so a
//! message can grow past the 64 KiB line cap) and one of its position, then the stream.
//!
//! Asserts: nothing panics; each message read is exactly the next line of the stream, its
//! text (without the newline) at most `MAX_LINE_BYTES`; reading stops with `InvalidData`
//! only at a line over the cap, an unterminated last line, or a line that is no runner
//! message; both message types survive their JSON round trip as one line.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use perago_contract::protocol::{MAX_LINE_BYTES, RunnerMessage, SidecarMessage};
use perago_sidecar::runner::read_message;
use tokio::io::BufReader;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime")
    })
}

fn round_trips<M>(message: &M)
where
    M: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let text = serde_json::to_string(message).expect("a message serialises");
    assert!(
        !text.contains('\n'),
        "a message must fit one line: {text:?}"
    );
    let back: M = serde_json::from_str(&text).expect("a message parses back");
    assert_eq!(&back, message);
}

fuzz_target!(|data: &[u8]| {
    let [c0, c1, pad, at, rest @ ..] = data else {
        return;
    };
    let capacity = 1 + usize::from(u16::from_le_bytes([*c0, *c1]) % 8192);
    let mut stream = rest.to_vec();
    let at = usize::from(*at).min(stream.len());
    stream.splice(at..at, std::iter::repeat_n(b' ', usize::from(*pad) * 600));

    for line in stream.split(|b| *b == b'\n') {
        if let Ok(m) = serde_json::from_slice::<SidecarMessage>(line) {
            round_trips(&m);
        }
    }

    let mut reader = BufReader::with_capacity(capacity, stream.as_slice());
    let mut pos = 0;
    loop {
        let read = runtime().block_on(read_message(&mut reader));
        let remaining = &stream[pos..];
        let newline = remaining.iter().position(|b| *b == b'\n');
        match read {
            Ok(None) => {
                assert!(remaining.is_empty(), "end of stream reported early");
                break;
            }
            Ok(Some(message)) => {
                let end = newline.expect("a message ends with a newline");
                assert!(end <= MAX_LINE_BYTES, "a {end}-byte line was accepted");
                let line = &remaining[..=end];
                let expected: RunnerMessage =
                    serde_json::from_slice(line).expect("the line is the message");
                assert_eq!(expected, message);
                round_trips(&message);
                pos += end + 1;
            }
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
                let text = e.to_string();
                match newline {
                    Some(end) if end <= MAX_LINE_BYTES => {
                        assert!(text.starts_with("invalid message: "), "{text}");
                        assert!(
                            serde_json::from_slice::<RunnerMessage>(&remaining[..=end]).is_err()
                        );
                    }
                    _ if remaining.len() > MAX_LINE_BYTES => assert_eq!(text, "message too long"),
                    _ => assert_eq!(text, "connection closed mid-message"),
                }
                break;
            }
        }
    }
});
