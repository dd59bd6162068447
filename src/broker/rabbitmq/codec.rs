//! AMQP 0-9-1 frames as the proxy reads them, parsed with amq-protocol
//! (bodies are never parsed). A message is named by its `message-id`
//! property, which comes in the content header after the method: a
//! publish and a delivery are known at their header.

use std::collections::{HashMap, HashSet};

use amq_protocol::frame::{parse_frame, AMQPFrame};
use amq_protocol::protocol::{basic, channel, confirm, AMQPClass};

use crate::broker::{Codec, Direction, Frame, Settle};

/// What one connection's frames have said so far.
#[derive(Default)]
pub struct AmqpCodec {
    /// A Deliver waits for its content header: channel → (delivery tag, redelivered).
    deliver_pending: HashMap<u16, (u64, bool)>,
    /// Body bytes still to come for the content in progress, per channel.
    body_left: HashMap<u16, u64>,
    /// (channel, delivery tag) → message id.
    deliveries: HashMap<(u16, u64), String>,
    /// Channels in confirm mode → publishes so far (the confirm's delivery tag).
    confirm_seq: HashMap<u16, u64>,
    /// A publish waits for its content header: channel → sequence number.
    publish_pending: HashMap<u16, u64>,
    /// (channel, publish sequence number) → message id.
    published: HashMap<(u16, u64), String>,
    /// Channels whose consumer asked for autoAck (Basic.Consume no-ack).
    no_ack: HashSet<u16>,
}

impl AmqpCodec {
    /// A channel (re)opened: what its number meant before is gone.
    fn channel_opened(&mut self, ch: u16) {
        self.deliver_pending.remove(&ch);
        self.publish_pending.remove(&ch);
        self.confirm_seq.remove(&ch);
        self.deliveries.retain(|(c, _), _| *c != ch);
        self.published.retain(|(c, _), _| *c != ch);
        self.no_ack.remove(&ch);
    }

    /// The deliveries a settle of `tag` covers: that one or, with
    /// `multiple`, every one of the channel's up to it (tag 0: all of
    /// them), in tag order. Settled, they are forgotten: a later
    /// `multiple` covers only what is still outstanding.
    fn settled(&mut self, ch: u16, tag: u64, multiple: bool, how: Settle) -> Frame {
        let mut covers: Vec<(u64, String)> = self
            .deliveries
            .iter()
            .filter(|((c, t), _)| *c == ch && (*t == tag || (multiple && (tag == 0 || *t <= tag))))
            .map(|((_, t), m)| (*t, m.clone()))
            .collect();
        covers.sort();
        for (t, _) in &covers {
            self.deliveries.remove(&(ch, *t));
        }
        Frame::Settled {
            covers: covers.into_iter().map(|(_, m)| m).collect(),
            multiple,
            how,
        }
    }
}

fn message_id(h: &amq_protocol::frame::AMQPContentHeader) -> String {
    h.properties
        .message_id()
        .as_ref()
        .map(|s| s.to_string())
        .unwrap_or_default()
}

impl Codec for AmqpCodec {
    /// The 8-byte protocol header counts as one frame.
    fn frame_len(&self, buf: &[u8]) -> Option<usize> {
        frame_len(buf)
    }

    /// A Basic.Deliver method frame (class 60, method 60).
    fn begins_delivery(&self, frame: &[u8]) -> bool {
        frame.len() > 11 && frame[0] == 1 && frame[7..11] == [0, 60, 0, 60]
    }

    fn content(&mut self, frame: &[u8]) -> Option<bool> {
        if frame.first() != Some(&3) || frame.len() < 8 {
            return None;
        }
        let ch = u16::from_be_bytes([frame[1], frame[2]]);
        let left = self.body_left.get(&ch).copied().unwrap_or(0);
        let size = (frame.len() - 8) as u64;
        self.body_left.insert(ch, left.saturating_sub(size));
        Some(left > 0)
    }

    /// Long because it is one match, an arm per (direction, frame kind)
    /// the proxy follows; each arm is a few lines.
    fn read(&mut self, dir: Direction, frame: &[u8]) -> Frame {
        let Ok((_, parsed)) = parse_frame(frame) else {
            return Frame::Other;
        };
        if let AMQPFrame::Header(ch, h) = &parsed {
            self.body_left.insert(*ch, h.body_size);
        }
        use basic::AMQPMethod as B;
        use Direction::{ToBroker, ToClient};
        match (dir, parsed) {
            (ToBroker, AMQPFrame::Method(ch, AMQPClass::Channel(channel::AMQPMethod::Open(_)))) => {
                self.channel_opened(ch)
            }
            (
                ToBroker,
                AMQPFrame::Method(ch, AMQPClass::Confirm(confirm::AMQPMethod::Select(_))),
            ) => {
                self.confirm_seq.insert(ch, 0);
            }
            (ToBroker, AMQPFrame::Method(ch, AMQPClass::Basic(B::Publish(_)))) => {
                let seq = self.confirm_seq.get(&ch).map_or(0, |s| s + 1);
                if let Some(s) = self.confirm_seq.get_mut(&ch) {
                    *s = seq;
                }
                self.publish_pending.insert(ch, seq);
                return Frame::PublishBegins { channel: ch };
            }
            (ToBroker, AMQPFrame::Header(ch, h)) => {
                if let Some(seq) = self.publish_pending.remove(&ch) {
                    let message = message_id(&h);
                    self.published.insert((ch, seq), message.clone());
                    return Frame::Published {
                        channel: ch,
                        message,
                    };
                }
            }
            (ToBroker, AMQPFrame::Method(ch, AMQPClass::Basic(B::Consume(c)))) => {
                if c.no_ack {
                    self.no_ack.insert(ch);
                }
                return Frame::Consume { no_ack: c.no_ack };
            }
            (ToBroker, AMQPFrame::Method(_, AMQPClass::Basic(B::Qos(q)))) => {
                return Frame::Qos {
                    prefetch: q.prefetch_count,
                }
            }
            (ToBroker, AMQPFrame::Method(ch, AMQPClass::Basic(B::Ack(a)))) => {
                return self.settled(ch, a.delivery_tag, a.multiple, Settle::Ack)
            }
            (ToBroker, AMQPFrame::Method(ch, AMQPClass::Basic(B::Nack(n)))) => {
                let how = Settle::Nack { requeue: n.requeue };
                return self.settled(ch, n.delivery_tag, n.multiple, how);
            }
            (ToBroker, AMQPFrame::Method(ch, AMQPClass::Basic(B::Reject(r)))) => {
                let how = Settle::Reject { requeue: r.requeue };
                return self.settled(ch, r.delivery_tag, false, how);
            }
            (ToClient, AMQPFrame::Method(ch, AMQPClass::Basic(B::Deliver(d)))) => {
                self.deliver_pending
                    .insert(ch, (d.delivery_tag, d.redelivered));
            }
            (ToClient, AMQPFrame::Header(ch, h)) => {
                if let Some((tag, redelivered)) = self.deliver_pending.remove(&ch) {
                    let message = message_id(&h);
                    self.deliveries.insert((ch, tag), message.clone());
                    return Frame::Delivered {
                        message,
                        redelivered,
                        auto_ack: self.no_ack.contains(&ch),
                    };
                }
            }
            (ToClient, AMQPFrame::Method(ch, AMQPClass::Basic(B::Ack(a)))) => {
                return self.confirmed(ch, a.delivery_tag, a.multiple, true)
            }
            (ToClient, AMQPFrame::Method(ch, AMQPClass::Basic(B::Nack(n)))) => {
                return self.confirmed(ch, n.delivery_tag, n.multiple, false)
            }
            // A channel exception (404 NOT_FOUND, 406 PRECONDITION_FAILED,
            // ...): the broker closes the channel with its reason and the
            // method it refused (class 40: exchange, 50: queue, 60/20:
            // basic.consume). A connection the broker closes (a restart's
            // 320) is not one.
            (ToClient, AMQPFrame::Method(_, AMQPClass::Channel(channel::AMQPMethod::Close(c))))
                if c.reply_code != 200 =>
            {
                let consume_missing = c.reply_code == 404 && (c.class_id, c.method_id) == (60, 20);
                return Frame::Refused {
                    text: format!("{} {}", c.reply_code, c.reply_text),
                    topology: matches!(c.class_id, 40 | 50) || consume_missing,
                };
            }
            _ => {}
        }
        Frame::Other
    }
}

impl AmqpCodec {
    /// The broker's answer for publish `tag` of channel `ch` (and, with
    /// `multiple`, every one before it).
    fn confirmed(&self, ch: u16, tag: u64, multiple: bool, ack: bool) -> Frame {
        let mut covers: Vec<(u64, String)> = self
            .published
            .iter()
            .filter(|((pc, seq), _)| *pc == ch && (*seq == tag || (multiple && *seq <= tag)))
            .map(|((_, seq), m)| (*seq, m.clone()))
            .collect();
        covers.sort();
        Frame::Confirmed {
            covers: covers.into_iter().map(|(_, m)| m).collect(),
            ack,
        }
    }
}

/// The length of the first complete frame in `buf` (the 8-byte protocol
/// header counts as one), or None when more bytes are needed.
fn frame_len(buf: &[u8]) -> Option<usize> {
    match buf.first()? {
        b'A' => (buf.len() >= 8).then_some(8),
        _ if buf.len() < 7 => None,
        _ => {
            let size = u32::from_be_bytes([buf[3], buf[4], buf[5], buf[6]]) as usize;
            let len = 7 + size + 1;
            (buf.len() >= len).then_some(len)
        }
    }
}

#[cfg(test)]
mod tests;
