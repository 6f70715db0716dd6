//! Each control message through a line: its wire shape, the round trip of encoding and decoding,
//! and malformed lines as errors.

use super::{decode_client, decode_router, encode};
use crate::ids::{SessionId, StreamId};
use crate::message::tests::{broker_hello, listener_hello};
use crate::message::*;

#[test]
fn the_wire_shape_of_each_message() {
    let hello: ClientMessage = decode_client(
        br#"{"type":"hello","role":"broker","client_id":"broker-a.dynamo","versions":[1],"dynamo_namespaces":["dynamo","team-b"],"extra":true}"#,
    )
    .unwrap();
    assert_eq!(hello, ClientMessage::Hello(broker_hello()));
    let sub = decode_router(
        br#"{"type":"subscribe","stream_id":"strm-0000000000000000000000000000002a","target":{"kind":"zmq","namespace":"dynamo","host":"10.0.0.7","port":5557,"topic":"kv-events"}}"#,
    )
    .unwrap();
    assert_eq!(
        sub,
        RouterMessage::Subscribe {
            stream_id: StreamId::from_random(42),
            target: Target::Zmq {
                namespace: "dynamo".into(),
                host: "10.0.0.7".into(),
                port: 5557,
                topic: Topic::KvEvents,
            },
        }
    );
    let closed =
        decode_client(br#"{"type":"stream_closed","stream_id":"strm-0000000000000000000000000000002a","reason":"something_new"}"#)
            .unwrap();
    assert_eq!(
        closed,
        ClientMessage::StreamClosed {
            stream_id: StreamId::from_random(42),
            reason: CloseReason::Error,
        }
    );
    assert_eq!(
        decode_client(br#"{"type":"draining"}"#).unwrap(),
        ClientMessage::Draining
    );
}

#[test]
fn every_message_round_trips_through_a_line() {
    let client = [
        ClientMessage::Hello(broker_hello()),
        ClientMessage::Hello(listener_hello()),
        ClientMessage::StreamClosed {
            stream_id: StreamId::from_random(7),
            reason: CloseReason::TargetNotAdvertised,
        },
        ClientMessage::Draining,
        ClientMessage::Heartbeat { seq: 3 },
        ClientMessage::HeartbeatAck { seq: u64::MAX },
    ];
    for m in client {
        let mut line = Vec::new();
        encode(&m, &mut line);
        assert_eq!(line.pop(), Some(b'\n'));
        assert!(!line.contains(&b'\n'));
        assert_eq!(decode_client(&line).unwrap(), m);
    }
    let router = [
        RouterMessage::Welcome(Welcome {
            session_id: SessionId::from_random(u128::MAX - 1),
            version: 1,
            limits: Limits {
                max_streams_per_session: 1024,
                max_session_buffer_bytes: 64 << 20,
                stream_buffer_bytes: 16 << 10,
                heartbeat_interval_ms: 10_000,
                idle_timeout_ms: 30_000,
            },
        }),
        RouterMessage::Subscribe {
            stream_id: StreamId::from_random(1),
            target: Target::Announced {
                backend: "vllm-a".into(),
                last_event_id: Some(99),
            },
        },
        RouterMessage::Subscribe {
            stream_id: StreamId::from_random(2),
            target: Target::Announced {
                backend: "vllm-a".into(),
                last_event_id: None,
            },
        },
        RouterMessage::Unsubscribe {
            stream_id: StreamId::from_random(1),
        },
        RouterMessage::Heartbeat { seq: 0 },
        RouterMessage::HeartbeatAck { seq: 1 },
    ];
    for m in router {
        let mut line = Vec::new();
        encode(&m, &mut line);
        assert_eq!(decode_router(&line[..line.len() - 1]).unwrap(), m);
    }
}

#[test]
fn malformed_lines_are_errors_not_panics() {
    for bad in [
        &b""[..],
        b"{}",
        b"[]",
        b"{\"type\":\"welcome\"}",
        b"{\"type\":\"hello\",\"role\":\"admin\",\"client_id\":\"x\",\"versions\":[1]}",
        b"{\"type\":\"heartbeat\",\"seq\":-1}",
        b"{\"type\":\"stream_closed\",\"stream_id\":\"sess-00000000000000000000000000000000\",\"reason\":\"eof\"}",
        b"\xff\xfe",
    ] {
        assert!(decode_client(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
    }
    assert!(decode_router(b"{\"type\":\"hello\"}").is_err());
}
