//! The codec on frames as a client and a broker write them: each frame
//! made by amq-protocol's own generator (the bytes lapin sends and reads),
//! fed in a session's order, with what the codec reads, as a table.

use amq_protocol::frame::{gen_frame, AMQPContentHeader, AMQPFrame, WriteContext};
use amq_protocol::protocol::{basic, channel, confirm, AMQPClass};

use super::*;
use crate::broker::{Direction::*, Frame, Settle};

fn bytes(f: &AMQPFrame) -> Vec<u8> {
    gen_frame(f)(WriteContext::from(Vec::new()))
        .expect("a frame serializes")
        .write
}

fn method(ch: u16, m: basic::AMQPMethod) -> Vec<u8> {
    bytes(&AMQPFrame::Method(ch, AMQPClass::Basic(m)))
}

fn header(ch: u16, message: &str, body: u64) -> Vec<u8> {
    bytes(&AMQPFrame::Header(
        ch,
        AMQPContentHeader {
            class_id: 60,
            body_size: body,
            properties: basic::AMQPProperties::default().with_message_id(message.into()),
        },
    ))
}

fn body(ch: u16, data: &[u8]) -> Vec<u8> {
    bytes(&AMQPFrame::Body(ch, data.to_vec()))
}

fn open(ch: u16) -> Vec<u8> {
    bytes(&AMQPFrame::Method(
        ch,
        AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
    ))
}

fn select(ch: u16) -> Vec<u8> {
    bytes(&AMQPFrame::Method(
        ch,
        AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select {
            nowait: false,
        })),
    ))
}

fn publish(ch: u16) -> Vec<u8> {
    method(
        ch,
        basic::AMQPMethod::Publish(basic::Publish {
            exchange: "".into(),
            routing_key: "orders".into(),
            mandatory: true,
            immediate: false,
        }),
    )
}

fn deliver(ch: u16, tag: u64, redelivered: bool) -> Vec<u8> {
    method(
        ch,
        basic::AMQPMethod::Deliver(basic::Deliver {
            consumer_tag: "c".into(),
            delivery_tag: tag,
            redelivered,
            exchange: "".into(),
            routing_key: "orders".into(),
        }),
    )
}

fn ack(ch: u16, tag: u64, multiple: bool) -> Vec<u8> {
    method(
        ch,
        basic::AMQPMethod::Ack(basic::Ack {
            delivery_tag: tag,
            multiple,
        }),
    )
}

fn nack(ch: u16, tag: u64, multiple: bool, requeue: bool) -> Vec<u8> {
    method(
        ch,
        basic::AMQPMethod::Nack(basic::Nack {
            delivery_tag: tag,
            multiple,
            requeue,
        }),
    )
}

fn consume(ch: u16, no_ack: bool) -> Vec<u8> {
    method(
        ch,
        basic::AMQPMethod::Consume(basic::Consume {
            queue: "orders".into(),
            consumer_tag: "c".into(),
            no_local: false,
            no_ack,
            exclusive: false,
            nowait: false,
            arguments: Default::default(),
        }),
    )
}

fn published(ch: u16, m: &str) -> Frame {
    Frame::Published {
        channel: ch,
        message: m.into(),
    }
}

fn confirmed(covers: &[&str], ack: bool) -> Frame {
    Frame::Confirmed {
        covers: covers.iter().map(|m| m.to_string()).collect(),
        ack,
    }
}

fn delivered(m: &str, redelivered: bool, auto_ack: bool) -> Frame {
    Frame::Delivered {
        message: m.into(),
        redelivered,
        auto_ack,
    }
}

fn settled(covers: &[&str], multiple: bool, how: Settle) -> Frame {
    Frame::Settled {
        covers: covers.iter().map(|m| m.to_string()).collect(),
        multiple,
        how,
    }
}

/// Reads a session, frame after frame, on one codec: each row is a frame,
/// its direction and what the codec must read (a body frame: whether it
/// finishes a content in progress).
fn session(rows: Vec<(Direction, Vec<u8>, Read)>) {
    let mut c = AmqpCodec::default();
    for (i, (dir, frame, want)) in rows.into_iter().enumerate() {
        assert_eq!(
            c.frame_len(&frame),
            Some(frame.len()),
            "row {i}: its length"
        );
        let got = match c.content(&frame) {
            Some(in_progress) => Read::Content(in_progress),
            None => Read::Frame(c.read(dir, &frame)),
        };
        assert_eq!(got, want, "row {i}");
    }
}

#[derive(Debug, PartialEq)]
enum Read {
    Frame(Frame),
    Content(bool),
}
use Read::Content;

fn f(frame: Frame) -> Read {
    Read::Frame(frame)
}

/// A producer in confirm mode: publish (method, header, body), the
/// broker's confirms one by one, `multiple`, and a nack.
#[test]
fn a_producer_publishes_and_the_broker_confirms() {
    session(vec![
        (ToBroker, b"AMQP\x00\x00\x09\x01".to_vec(), f(Frame::Other)),
        (ToBroker, open(1), f(Frame::Other)),
        (ToBroker, select(1), f(Frame::Other)),
        (ToBroker, publish(1), f(Frame::PublishBegins { channel: 1 })),
        (ToBroker, header(1, "mid-1", 3), f(published(1, "mid-1"))),
        (ToBroker, body(1, b"abc"), Content(true)),
        (ToClient, ack(1, 1, false), f(confirmed(&["mid-1"], true))),
        (ToBroker, publish(1), f(Frame::PublishBegins { channel: 1 })),
        (ToBroker, header(1, "mid-2", 2), f(published(1, "mid-2"))),
        (ToBroker, body(1, b"de"), Content(true)),
        (ToBroker, publish(1), f(Frame::PublishBegins { channel: 1 })),
        (ToBroker, header(1, "mid-3", 1), f(published(1, "mid-3"))),
        (ToBroker, body(1, b"f"), Content(true)),
        // A body frame past the content's end is none of it.
        (ToBroker, body(1, b"g"), Content(false)),
        (
            ToClient,
            ack(1, 2, true),
            f(confirmed(&["mid-1", "mid-2"], true)),
        ),
        (
            ToClient,
            nack(1, 3, false, false),
            f(confirmed(&["mid-3"], false)),
        ),
        (ToBroker, bytes(&AMQPFrame::Heartbeat), f(Frame::Other)),
    ]);
}

/// A publish without confirm mode still names its message; a confirm on
/// another channel covers nothing of this one's.
#[test]
fn publishes_are_numbered_per_channel_in_confirm_mode_only() {
    session(vec![
        (ToBroker, open(1), f(Frame::Other)),
        (ToBroker, publish(1), f(Frame::PublishBegins { channel: 1 })),
        (ToBroker, header(1, "plain", 0), f(published(1, "plain"))),
        (ToBroker, open(2), f(Frame::Other)),
        (ToBroker, select(2), f(Frame::Other)),
        (ToBroker, publish(2), f(Frame::PublishBegins { channel: 2 })),
        (ToBroker, header(2, "mid-1", 0), f(published(2, "mid-1"))),
        (ToClient, ack(1, 1, false), f(confirmed(&[], true))),
        (ToClient, ack(2, 1, false), f(confirmed(&["mid-1"], true))),
    ]);
}

/// A consumer: qos, consume, deliveries (one redelivered), a single ack,
/// a `multiple` ack covering the two still outstanding, a nack, a reject, a
/// `multiple` nack of tag 0 (all of them); a tag settled is forgotten.
/// Long: one captured exchange, frame by frame, in the order it happens.
#[test]
fn a_consumer_is_delivered_and_settles() {
    let reject = |tag, requeue| {
        method(
            1,
            basic::AMQPMethod::Reject(basic::Reject {
                delivery_tag: tag,
                requeue,
            }),
        )
    };
    let qos = method(
        1,
        basic::AMQPMethod::Qos(basic::Qos {
            prefetch_count: 10,
            global: false,
        }),
    );
    session(vec![
        (ToBroker, open(1), f(Frame::Other)),
        (ToBroker, qos, f(Frame::Qos { prefetch: 10 })),
        (
            ToBroker,
            consume(1, false),
            f(Frame::Consume { no_ack: false }),
        ),
        (ToClient, deliver(1, 1, false), f(Frame::Other)),
        (
            ToClient,
            header(1, "mid-1", 2),
            f(delivered("mid-1", false, false)),
        ),
        (ToClient, body(1, b"{}"), Content(true)),
        (ToClient, deliver(1, 2, true), f(Frame::Other)),
        (
            ToClient,
            header(1, "mid-2", 0),
            f(delivered("mid-2", true, false)),
        ),
        (ToClient, deliver(1, 3, false), f(Frame::Other)),
        (
            ToClient,
            header(1, "mid-3", 0),
            f(delivered("mid-3", false, false)),
        ),
        (ToClient, deliver(1, 4, false), f(Frame::Other)),
        (
            ToClient,
            header(1, "mid-4", 0),
            f(delivered("mid-4", false, false)),
        ),
        (
            ToBroker,
            ack(1, 1, false),
            f(settled(&["mid-1"], false, Settle::Ack)),
        ),
        (
            ToBroker,
            ack(1, 3, true),
            f(settled(&["mid-2", "mid-3"], true, Settle::Ack)),
        ),
        // Settled already: a single ack of it covers nothing.
        (
            ToBroker,
            ack(1, 2, false),
            f(settled(&[], false, Settle::Ack)),
        ),
        (
            ToBroker,
            nack(1, 4, false, true),
            f(settled(&["mid-4"], false, Settle::Nack { requeue: true })),
        ),
        (ToClient, deliver(1, 5, true), f(Frame::Other)),
        (
            ToClient,
            header(1, "mid-4", 0),
            f(delivered("mid-4", true, false)),
        ),
        (
            ToBroker,
            reject(5, false),
            f(settled(
                &["mid-4"],
                false,
                Settle::Reject { requeue: false },
            )),
        ),
        (ToClient, deliver(1, 6, false), f(Frame::Other)),
        (
            ToClient,
            header(1, "mid-5", 0),
            f(delivered("mid-5", false, false)),
        ),
        (ToClient, deliver(1, 7, false), f(Frame::Other)),
        (
            ToClient,
            header(1, "mid-6", 0),
            f(delivered("mid-6", false, false)),
        ),
        (
            ToBroker,
            nack(1, 0, true, false),
            f(settled(
                &["mid-5", "mid-6"],
                true,
                Settle::Nack { requeue: false },
            )),
        ),
        // A tag the codec never saw delivered names no message.
        (
            ToBroker,
            ack(1, 9, false),
            f(settled(&[], false, Settle::Ack)),
        ),
    ]);
}

/// autoAck: the consume's no-ack bit marks the channel's deliveries; a
/// channel opened again forgets its deliveries and its no-ack bit.
#[test]
fn an_auto_ack_consumer_and_a_channel_opened_again() {
    session(vec![
        (ToBroker, open(1), f(Frame::Other)),
        (
            ToBroker,
            consume(1, true),
            f(Frame::Consume { no_ack: true }),
        ),
        (ToClient, deliver(1, 1, false), f(Frame::Other)),
        (
            ToClient,
            header(1, "mid-1", 0),
            f(delivered("mid-1", false, true)),
        ),
        (ToBroker, open(1), f(Frame::Other)),
        (
            ToBroker,
            ack(1, 1, false),
            f(settled(&[], false, Settle::Ack)),
        ),
        (ToClient, deliver(1, 1, false), f(Frame::Other)),
        (
            ToClient,
            header(1, "mid-2", 0),
            f(delivered("mid-2", false, false)),
        ),
    ]);
}

/// The broker closes a channel over a declaration it refuses: read, with
/// its words; a client's own close of its channel (200) is nothing.
#[test]
fn a_refused_declaration_closes_the_channel() {
    let close = |code, text: &str, class_id, method_id| {
        bytes(&AMQPFrame::Method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::Close(channel::Close {
                reply_code: code,
                reply_text: text.into(),
                class_id,
                method_id,
            })),
        ))
    };
    let refusal = "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q'";
    let unknown_tag = "PRECONDITION_FAILED - unknown delivery tag 7";
    session(vec![
        (ToBroker, open(1), f(Frame::Other)),
        (
            ToClient,
            close(406, refusal, 50, 10),
            f(Frame::Refused {
                text: format!("406 {refusal}"),
                topology: true,
            }),
        ),
        (
            ToClient,
            close(404, "NOT_FOUND - no queue 'q'", 60, 20),
            f(Frame::Refused {
                text: "404 NOT_FOUND - no queue 'q'".into(),
                topology: true,
            }),
        ),
        // A refusal of something else (an ack of an unknown tag): no
        // topology's.
        (
            ToClient,
            close(406, unknown_tag, 60, 80),
            f(Frame::Refused {
                text: format!("406 {unknown_tag}"),
                topology: false,
            }),
        ),
        (ToBroker, close(200, "bye", 0, 0), f(Frame::Other)),
        (ToClient, close(200, "bye", 0, 0), f(Frame::Other)),
    ]);
}

/// Frames are cut at their length whatever the reads: the protocol header
/// by itself, a frame split across two reads waits for its rest, two
/// frames in one read are two; only a Basic.Deliver begins a delivery.
#[test]
fn frames_are_cut_at_their_length() {
    let c = AmqpCodec::default();
    assert_eq!(c.frame_len(b"AMQP\x00\x00\x09\x01rest"), Some(8));
    assert_eq!(c.frame_len(b"AMQP\x00"), None);
    assert_eq!(c.frame_len(&bytes(&AMQPFrame::Heartbeat)), Some(8));
    let d = deliver(1, 7, false);
    for cut in [1, 6, 7, d.len() - 1] {
        assert_eq!(c.frame_len(&d[..cut]), None, "split at {cut}");
    }
    let mut two = d.clone();
    two.extend_from_slice(&header(1, "mid-1", 0));
    assert_eq!(c.frame_len(&two), Some(d.len()));
    assert!(c.begins_delivery(&d));
    for other in [ack(1, 7, false), header(1, "mid-1", 0), publish(1), open(1)] {
        assert!(!c.begins_delivery(&other));
    }
}
