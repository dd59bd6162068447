//! The consumer's failure paths: a failed business write retried in
//! place, through retry tiers or the broker's dead-lettering, classified
//! (article 000's classes), and the DLQ move with its confirm.

use super::*;

/// How the classified path publishes its copies (to a retry tier, to the
/// DLQ) and acks the original: each order and each publish a setting of
/// the pattern, so that a lab can show each one necessary.
#[derive(Clone, Copy)]
pub(super) struct Copies {
    retry_order: DlqOrder,
    retry_publish: Publish,
    dlq_order: DlqOrder,
    dlq_publish: Publish,
}

impl Copies {
    /// Each copy confirmed and `mandatory`, then the original acked.
    const GUARDED: Copies = Copies {
        retry_order: DlqOrder::ConfirmThenAck,
        retry_publish: GUARDED,
        dlq_order: DlqOrder::ConfirmThenAck,
        dlq_publish: GUARDED,
    };
}

impl Consumer {
    /// A failed business write, the transaction still open with the inbox row.
    pub(super) async fn failed(
        &mut self,
        d: &Delivery,
        meta: &MessageMeta,
        attempt: u32,
        event_id: &str,
        class: FailureClass,
        error: &str,
    ) -> Result<Outcome> {
        tracing::warn!(message = %meta.message_id, attempt, %class, error, "business write failed");
        match self.def().on_failure {
            OnFailure::Classified {
                dlq,
                by_class,
                retry_order,
                retry_publish,
                dlq_publish,
                ..
            } => {
                let class = if by_class {
                    class
                } else {
                    FailureClass::Transient
                };
                let copies = Copies {
                    retry_order,
                    retry_publish,
                    dlq_order: dlq,
                    dlq_publish,
                };
                self.classified(d, meta, attempt, (event_id, class, error), copies)
                    .await
            }
            OnFailure::RetryInPlace { dlq_publish } => {
                self.retry_in_place(d, meta, attempt, (event_id, class, error), dlq_publish)
                    .await
            }
            OnFailure::RequeueForever => {
                store::rollback(&mut self.db).await?;
                self.link.reject(d, true).await?;
                emit(
                    self.line(meta)
                        .with("attempt", attempt)
                        .status(Status::Requeued),
                );
                Ok(Outcome::Pending)
            }
            OnFailure::RetryThenDlq {
                confirm,
                mandatory,
                dlq,
                ..
            } => {
                self.retry_then_dlq(d, meta, attempt, class, error, (confirm, mandatory), dlq)
                    .await
            }
        }
    }

    /// RetryInPlace's failure: a transient one rolled back and tried again
    /// on the same delivery (held: what is behind it waits), the last
    /// attempt's as `classified` does it, its DLQ copy published as
    /// `dlq_publish` says.
    pub(super) async fn retry_in_place(
        &mut self,
        d: &Delivery,
        meta: &MessageMeta,
        attempt: u32,
        (event_id, class, error): (&str, FailureClass, &str),
        dlq_publish: Publish,
    ) -> Result<Outcome> {
        let retry = self
            .cfg
            .retry
            .clone()
            .context("a consumer that retries in place without a retry policy")?;
        if class == FailureClass::Transient && attempt < retry.max_attempts {
            store::rollback(&mut self.db).await?;
            emit(
                self.line(meta)
                    .with("attempt", attempt)
                    .with("failureClass", class)
                    .status(Status::RetryInPlace),
            );
            return Ok(Outcome::RetryInPlace);
        }
        // Out of attempts, the class's way (it publishes no retry copy).
        let copies = Copies {
            dlq_publish,
            ..Copies::GUARDED
        };
        self.classified(d, meta, attempt, (event_id, class, error), copies)
            .await
    }

    /// The retry-dlq page's failure: rejected into the broker's retry loop
    /// until the last attempt, then moved to the DLQ.
    #[allow(clippy::too_many_arguments)] // the delivery, its failure, and the move's settings
    pub(super) async fn retry_then_dlq(
        &mut self,
        d: &Delivery,
        meta: &MessageMeta,
        attempt: u32,
        class: FailureClass,
        error: &str,
        (confirm, mandatory): (bool, bool),
        dlq: DlqOrder,
    ) -> Result<Outcome> {
        // The retry-dlq page: every failure takes the same loop.
        store::rollback(&mut self.db).await?;
        let Some(retry) = self.cfg.retry.clone() else {
            // Rejected, it would be dropped: a silent skip.
            anyhow::ensure!(
                class != FailureClass::Conflict,
                "{}: a conflict (another business content under an eventId already applied) and no DLQ to isolate it in (the consume step sets no `retry`)",
                meta.message_id
            );
            self.link.reject(d, false).await?;
            return self.settled(meta, attempt, Status::Rejected);
        };
        // A conflict is no failure that passes: isolated at once.
        if attempt < retry.max_attempts && class != FailureClass::Conflict {
            self.link.reject(d, false).await?;
            emit(
                self.line(meta)
                    .with("attempt", attempt)
                    .status(Status::Retry),
            );
            return Ok(match self.cfg.rejected_leave {
                true => Outcome::Left,
                false => Outcome::Pending,
            });
        }
        let headers = diagnostics(&self.cfg, d, meta, attempt, class, error);
        self.move_to_dlq(&retry.dlq, d, meta, headers, dlq, (confirm, mandatory))
            .await?;
        if class == FailureClass::Conflict {
            emit(
                self.line(meta)
                    .with("attempt", attempt)
                    .with("failureClass", class)
                    .status(Status::MovedToDlq),
            );
            return Ok(Outcome::Settled);
        }
        self.settled(meta, attempt, Status::PoisonToDlq)
    }

    /// Article 000's classes: a business rejection is recorded (with the
    /// inbox row, in the open transaction) and acked; a transient failure is
    /// republished to its retry tier (confirmed), then acked; poison, an
    /// invariant violation, or a transient failure out of attempts is moved
    /// to the DLQ with its diagnostics; each copy published and the
    /// original acked as `copies` says.
    pub(super) async fn classified(
        &mut self,
        d: &Delivery,
        meta: &MessageMeta,
        attempt: u32,
        (event_id, class, error): (&str, FailureClass, &str),
        copies: Copies,
    ) -> Result<Outcome> {
        if class == FailureClass::BusinessRejection {
            store::record_rejection(&mut self.db, &self.cfg.service, event_id, error).await?;
            store::commit(&mut self.db).await?;
            self.ack(d).await?;
            emit(
                self.line(meta)
                    .with("attempt", attempt)
                    .with("failureClass", class)
                    .with("error", error)
                    .status(Status::BusinessRejected),
            );
            return Ok(Outcome::Settled);
        }
        store::rollback(&mut self.db).await?;
        let retry = self
            .cfg
            .retry
            .clone()
            .context("a classified consumer without a retry policy")?;
        let out_of_time = self.out_of_time(d, attempt, &retry);
        if class == FailureClass::Transient && attempt < retry.max_attempts && !out_of_time {
            let failed = (attempt, class, error);
            return self.retry_copy(d, meta, failed, &retry, copies).await;
        }
        let headers = diagnostics(&self.cfg, d, meta, attempt, class, error);
        let Publish { confirm, mandatory } = copies.dlq_publish;
        let order = copies.dlq_order;
        self.move_to_dlq(&retry.dlq, d, meta, headers, order, (confirm, mandatory))
            .await?;
        let mut line = (self.line(meta).with("attempt", attempt)).with("failureClass", class);
        // Attempts were left: the time budget ended them.
        if class == FailureClass::Transient && attempt < retry.max_attempts {
            line = line.with("budgetSpent", true);
        }
        emit(line.status(Status::MovedToDlq));
        Ok(Outcome::Settled)
    }

    /// Whether the retry policy's time budget, counted from the message's
    /// first failure (its `first-failed-at` header; none at attempt 1:
    /// now), is spent, for a pattern that keeps one (article 002: attempts
    /// stop at whichever of the count and the duration comes first). A
    /// retry whose header is missing or unreadable is taken as out of time
    /// (when in doubt, the DLQ, never another retry), and says so.
    fn out_of_time(&self, d: &Delivery, attempt: u32, retry: &RetryPolicy) -> bool {
        let keeps = matches!(
            self.def().on_failure,
            OnFailure::Classified { budget: true, .. }
        );
        let (Some(budget), true) = (retry.max_duration_ms, keeps) else {
            return false;
        };
        let header = d.headers.get(super::FIRST_FAILED_AT);
        if header.is_none() && attempt == 1 {
            return false;
        }
        let first = header.and_then(|t| humantime::parse_rfc3339(t).ok());
        let spent = first.and_then(|t| std::time::SystemTime::now().duration_since(t).ok());
        match spent {
            Some(s) => s.as_millis() >= u128::from(budget),
            None => {
                tracing::warn!(
                    ?header,
                    attempt,
                    "no readable first-failed-at: the time budget taken as spent"
                );
                true
            }
        }
    }

    /// A transient failure with attempts left: its copy for the tier its
    /// attempt owes, published and the original acked as `copies` says,
    /// with the window between the two.
    async fn retry_copy(
        &mut self,
        d: &Delivery,
        meta: &MessageMeta,
        (attempt, class, error): (u32, FailureClass, &str),
        retry: &RetryPolicy,
        copies: Copies,
    ) -> Result<Outcome> {
        // Attempt k waits in tier k (the last one after that); without
        // back-off, always in the first (or the last).
        let last = retry.tiers.len() - 1;
        let k = match self.def().on_failure {
            OnFailure::Classified {
                backoff: Backoff::FirstTier,
                ..
            } => 0,
            OnFailure::Classified {
                backoff: Backoff::LastTier,
                ..
            } => last,
            _ => (attempt as usize - 1).min(last),
        };
        let tier = &retry.tiers[k];
        let mut headers = diagnostics(&self.cfg, d, meta, attempt, class, error);
        headers.push((RETRY_ATTEMPT_HEADER, (attempt + 1).to_string()));
        headers.push((RETRY_PUBLISHED_AT, now_ms().to_string()));
        let Publish { confirm, mandatory } = copies.retry_publish;
        match copies.retry_order {
            DlqOrder::ConfirmThenAck => {
                self.link
                    .republish(d, &tier.queue, headers, (confirm, mandatory))
                    .await?;
                self.window(Window::AfterRetryPublishBeforeAck, meta)
                    .await?;
                self.ack(d).await?;
            }
            DlqOrder::AckThenPublish => {
                self.ack(d).await?;
                self.window(Window::AfterAckBeforeRetryPublish, meta)
                    .await?;
                self.link
                    .republish(d, &tier.queue, headers, (confirm, mandatory))
                    .await?;
            }
        }
        emit(
            self.line(meta)
                .with("attempt", attempt)
                .with("failureClass", class)
                .with("tier", &tier.queue)
                .with("ttlMs", tier.ttl_ms)
                .status(Status::RetryScheduled),
        );
        Ok(Outcome::Pending)
    }

    /// The DLQ copy published (with a confirm and `mandatory` as asked)
    /// and the original acked, in `order`, with the window between the two
    /// (after a confirm only when there is one).
    pub(super) async fn move_to_dlq(
        &mut self,
        dlq: &str,
        d: &Delivery,
        meta: &MessageMeta,
        headers: Vec<(&str, String)>,
        order: DlqOrder,
        (confirm, mandatory): (bool, bool),
    ) -> Result<()> {
        match order {
            DlqOrder::ConfirmThenAck => {
                self.link
                    .republish(d, dlq, headers, (confirm, mandatory))
                    .await?;
                if confirm {
                    self.window(Window::AfterDlqConfirmBeforeAck, meta).await?;
                }
                self.ack(d).await?;
            }
            DlqOrder::AckThenPublish => {
                self.ack(d).await?;
                self.window(Window::AfterAckBeforeDlqPublish, meta).await?;
                self.link
                    .republish(d, dlq, headers, (confirm, mandatory))
                    .await?;
            }
        }
        Ok(())
    }
}
