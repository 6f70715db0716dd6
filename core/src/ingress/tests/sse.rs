//! Unit tests of `core::ingress`: sse.
use crate::ingress::IngressError;
use crate::ingress::sse::{SseEvent, SseFramer};

fn all(input: &[u8], cap: usize) -> Result<Vec<SseEvent>, IngressError> {
    let mut f = SseFramer::new(cap);
    let mut out = Vec::new();
    for b in input {
        f.push(std::slice::from_ref(b), &mut out)?;
    }
    f.finish(&mut out)?;
    Ok(out)
}

#[test]
fn framing_rules() {
    let ev = all(
        b": keep-alive\r\ndata: {\"a\":1}\r\n\r\nevent: error\ndata: x\ndata: y\n\ndata:z\nretry: 5\n\ndata: last",
        1024,
    )
    .unwrap();
    assert_eq!(
        ev,
        vec![
            SseEvent {
                event: None,
                data: "{\"a\":1}".into()
            },
            SseEvent {
                event: Some("error".into()),
                data: "x\ny".into()
            },
            SseEvent {
                event: None,
                data: "z".into()
            },
            SseEvent {
                event: None,
                data: "last".into()
            },
        ]
    );
}

#[test]
fn utf8_split_inside_a_character() {
    let ev = all("data: héllo 한국어\n\n".as_bytes(), 1024).unwrap();
    assert_eq!(ev[0].data, "héllo 한국어");
    assert!(matches!(
        all(b"data: \xff\n\n", 1024),
        Err(IngressError::MalformedUpstream(_))
    ));
}

#[test]
fn cap_on_pending_line_and_event() {
    let long = format!("data: {}\n\n", "a".repeat(100));
    assert!(all(long.as_bytes(), 200).is_ok());
    assert_eq!(
        all(long.as_bytes(), 50),
        Err(IngressError::LineTooLong { cap: 50 })
    );
    // many short data lines in one event also count against the cap
    let many = "data: aaaaaaaaa\n".repeat(20);
    assert_eq!(
        all(many.as_bytes(), 100),
        Err(IngressError::LineTooLong { cap: 100 })
    );
}
