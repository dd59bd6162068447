//! PostgreSQL: the lab database, the inbox transaction's statements, and the
//! ground truth the checker reads back.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use sqlx::{Connection, PgConnection};

use crate::vocab::{FailureClass, InspectField};

/// The schema's migrations, embedded in the binary (a role or a lab run
/// reads no file of the project's): (version, description, SQL), as
/// `sqlx migrate` names them from `migrations/<version>_<description>.sql`.
/// Read at run time rather than by `sqlx::migrate!`, whose proc macro
/// compiles a second sqlx and tokio for the build host (about a minute of
/// a fresh build on two cores).
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "inbox", include_str!("../migrations/0001_inbox.sql")),
    (
        2,
        "rejections",
        include_str!("../migrations/0002_rejections.sql"),
    ),
    (
        3,
        "inbox digest",
        include_str!("../migrations/0003_inbox_digest.sql"),
    ),
    (
        4,
        "order state",
        include_str!("../migrations/0004_order_state.sql"),
    ),
    (
        5,
        "order service",
        include_str!("../migrations/0005_order_service.sql"),
    ),
    (
        6,
        "consumer intents",
        include_str!("../migrations/0006_consumer_intents.sql"),
    ),
];

/// [`MIGRATIONS`] as sqlx's migrator reads a source.
#[derive(Debug)]
struct Embedded;

impl sqlx::migrate::MigrationSource<'static> for Embedded {
    fn resolve(
        self,
    ) -> futures_util::future::BoxFuture<
        'static,
        std::result::Result<Vec<sqlx::migrate::Migration>, sqlx::error::BoxDynError>,
    > {
        let migrations = MIGRATIONS
            .iter()
            .map(|(version, description, sql)| {
                sqlx::migrate::Migration::new(
                    *version,
                    (*description).into(),
                    sqlx::migrate::MigrationType::Simple,
                    (*sql).into(),
                    false,
                )
            })
            .collect();
        Box::pin(async move { Ok(migrations) })
    }
}

pub async fn connect(url: &str) -> Result<PgConnection> {
    PgConnection::connect(url)
        .await
        .context("cannot connect to PostgreSQL")
}

/// Ends a connection with its Terminate message, so the server logs no
/// lost client; a failure to say goodbye changes nothing for the caller.
pub async fn close(conn: PgConnection) {
    let _ = conn.close().await;
}

/// A fresh database per lab run, so labs sharing one server cannot see each other.
pub async fn create_database(admin: &mut PgConnection, name: &str) -> Result<()> {
    sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\""))
        .execute(&mut *admin)
        .await?;
    sqlx::query(&format!("CREATE DATABASE \"{name}\""))
        .execute(&mut *admin)
        .await
        .with_context(|| format!("creating database `{name}`"))?;
    Ok(())
}

pub async fn migrate(conn: &mut PgConnection) -> Result<()> {
    let migrator = sqlx::migrate::Migrator::new(Embedded)
        .await
        .context("reading the migrations")?;
    migrator.run(conn).await.context("running migrations")?;
    Ok(())
}

pub async fn server_version(conn: &mut PgConnection) -> Result<String> {
    let (v,): (String,) = sqlx::query_as("SELECT current_setting('server_version')")
        .fetch_one(conn)
        .await?;
    Ok(format!("PostgreSQL {v}"))
}

/// The business payload. `amount` is required: a fixture without it is a
/// poison message whose business write fails the same way every time.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderCreated {
    pub event_id: String,
    pub order_id: String,
    pub amount: f64,
    pub currency: String,
    /// A change event's business version (order.updated): the order's
    /// state is set from it. An order.created carries none.
    #[serde(default)]
    pub version: Option<i64>,
    /// The status a change event sets (default `open`).
    #[serde(default)]
    pub status: Option<String>,
    /// A delayed check (order.payment-timeout): cancel the order if its
    /// status is still this one when the check runs.
    #[serde(default)]
    pub cancel_if_status: Option<String>,
    /// A delayed task (order.payment-reminder): due this long after it
    /// was scheduled (its sender's `published-at`, the host's clock) ...
    #[serde(default)]
    pub due_in_ms: Option<u64>,
    /// ... and run only up to this long after it was due; found later, it
    /// is recorded as skipped, not run (article 002: a reminder sent late
    /// may be worse than none).
    #[serde(default)]
    pub max_lateness_ms: Option<u64>,
}

impl OrderCreated {
    pub fn parse(body: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(body).map_err(|e| e.to_string())
    }

    /// The failure classes of article 000/002 for an order event: a body
    /// that does not parse is poison; a negative amount breaks an invariant;
    /// a currency the business does not take is a business rejection.
    pub fn classify(body: &[u8]) -> Result<Self, (FailureClass, String)> {
        let order = Self::parse(body).map_err(|e| (FailureClass::Poison, e))?;
        if order.amount < 0.0 {
            return Err((
                FailureClass::InvariantViolation,
                format!("amount {} is negative", order.amount),
            ));
        }
        if !ACCEPTED_CURRENCIES.contains(&order.currency.as_str()) {
            return Err((
                FailureClass::BusinessRejection,
                format!("currency `{}` is not accepted", order.currency),
            ));
        }
        Ok(order)
    }
}

/// The currencies the inventory service takes.
pub const ACCEPTED_CURRENCIES: &[&str] = &["CNY", "USD", "EUR"];

/// A business rejection, recorded in the open transaction (with the inbox row).
pub async fn record_rejection(
    conn: &mut PgConnection,
    consumer: &str,
    event_id: &str,
    reason: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO business_rejections (consumer_name, event_id, reason) VALUES ($1, $2, $3)",
    )
    .bind(consumer)
    .bind(event_id)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}

/// The inbox key of a delivery: the event id from the body (fallback: the
/// AMQP message id, so an unreadable body still has a stable key).
pub fn event_id(body: &[u8], message_id: &str) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("eventId")?.as_str().map(str::to_string))
        .unwrap_or_else(|| message_id.to_string())
}

/// Transaction control as plain statements on the one connection: the
/// consumer's steps open, commit or roll back in the order its pattern says.
pub async fn begin(conn: &mut PgConnection) -> Result<()> {
    sqlx::raw_sql("BEGIN").execute(conn).await?;
    Ok(())
}

pub async fn commit(conn: &mut PgConnection) -> Result<()> {
    sqlx::raw_sql("COMMIT").execute(conn).await?;
    Ok(())
}

pub async fn rollback(conn: &mut PgConnection) -> Result<()> {
    sqlx::raw_sql("ROLLBACK").execute(conn).await?;
    Ok(())
}

/// The consumer name an inbox keyed by the eventId alone writes: one row per
/// event, whichever service applied it (the `inbox-by-event` pattern).
pub const ANY_SERVICE: &str = "*";

/// `true` when this (consumer, event) was new; `false` means a duplicate.
pub async fn insert_inbox(conn: &mut PgConnection, consumer: &str, event_id: &str) -> Result<bool> {
    let r = sqlx::query(
        "INSERT INTO inbox_messages (consumer_name, event_id, processed_at) VALUES ($1, $2, now()) \
         ON CONFLICT (consumer_name, event_id) DO NOTHING",
    )
    .bind(consumer)
    .bind(event_id)
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// What the inbox says of a copy it is shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InboxRow {
    New,
    /// The same business content again.
    Duplicate,
    /// Another business content under a known eventId.
    Conflict,
    /// The database refused the statement after a caught unique violation
    /// (its SQLSTATE): the transaction was aborted, nothing could be read.
    Aborted(String),
}

/// The event's content, canonical: its JSON with the keys in order (a
/// copy re-serialised upstream compares equal; tested), or the bytes of a
/// body that is not JSON. The whole event: a resend must carry the same.
pub fn content(body: &[u8]) -> Vec<u8> {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => v.to_string().into_bytes(),
        Err(_) => body.to_vec(),
    }
}

/// The inbox row with the digest of `content`; when (consumer, event) is
/// there already, whether its digest is this content's: a duplicate, or a
/// conflict (also when the row has no digest). PostgreSQL computes the md5, so no hash is written here.
pub async fn insert_inbox_checked(
    conn: &mut PgConnection,
    consumer: &str,
    event_id: &str,
    content: &[u8],
) -> Result<InboxRow> {
    let r = sqlx::query(
        "INSERT INTO inbox_messages (consumer_name, event_id, processed_at, digest) \
         VALUES ($1, $2, now(), md5($3::bytea)) ON CONFLICT (consumer_name, event_id) DO NOTHING",
    )
    .bind(consumer)
    .bind(event_id)
    .bind(content)
    .execute(&mut *conn)
    .await?;
    if r.rows_affected() == 1 {
        return Ok(InboxRow::New);
    }
    let (same,): (Option<bool>,) = sqlx::query_as(
        "SELECT digest = md5($3::bytea) FROM inbox_messages WHERE consumer_name = $1 AND event_id = $2",
    )
    .bind(consumer)
    .bind(event_id)
    .bind(content)
    .fetch_one(&mut *conn)
    .await?;
    // No digest stored (a pattern that does not compare wrote the row):
    // whether the content is the same cannot be told, so not a duplicate.
    Ok(match same {
        Some(true) => InboxRow::Duplicate,
        _ => InboxRow::Conflict,
    })
}

/// The inbox row inserted without ON CONFLICT: a copy of a known event
/// raises unique_violation (23505), caught here, and the stored digest is
/// then read as [`insert_inbox_checked`] reads it. `savepoint`: the INSERT
/// runs under a savepoint the catch rolls back to. Without one PostgreSQL
/// has aborted the whole transaction at the violation and answers the
/// SELECT with 25P02 (article 000: do not go on in the original
/// transaction after catching the exception).
pub async fn insert_inbox_catching(
    conn: &mut PgConnection,
    consumer: &str,
    event_id: &str,
    content: &[u8],
    savepoint: bool,
) -> Result<InboxRow> {
    if savepoint {
        sqlx::query("SAVEPOINT inbox_row")
            .execute(&mut *conn)
            .await?;
    }
    let inserted = sqlx::query(
        "INSERT INTO inbox_messages (consumer_name, event_id, processed_at, digest) \
         VALUES ($1, $2, now(), md5($3::bytea))",
    )
    .bind(consumer)
    .bind(event_id)
    .bind(content)
    .execute(&mut *conn)
    .await;
    match inserted {
        Ok(_) => return Ok(InboxRow::New),
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {}
        Err(e) => return Err(e.into()),
    }
    if savepoint {
        sqlx::query("ROLLBACK TO SAVEPOINT inbox_row")
            .execute(&mut *conn)
            .await?;
    }
    let same: std::result::Result<(Option<bool>,), _> = sqlx::query_as(
        "SELECT digest = md5($3::bytea) FROM inbox_messages WHERE consumer_name = $1 AND event_id = $2",
    )
    .bind(consumer)
    .bind(event_id)
    .bind(content)
    .fetch_one(&mut *conn)
    .await;
    Ok(match same {
        Ok((Some(true),)) => InboxRow::Duplicate,
        Ok(_) => InboxRow::Conflict,
        // in_failed_sql_transaction; any other error is no finding.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("25P02") => InboxRow::Aborted(
            "SQLSTATE 25P02 on the SELECT after the caught unique violation".to_string(),
        ),
        Err(e) => return Err(e.into()),
    })
}

/// A service's inbox purge: deletes its rows processed longer ago than
/// `retention_ms`; how many it deleted.
pub async fn purge_inbox(
    conn: &mut PgConnection,
    consumer: &str,
    retention_ms: u64,
) -> Result<u64> {
    let r = sqlx::query(
        "DELETE FROM inbox_messages WHERE consumer_name = $1 \
         AND processed_at < now() - make_interval(secs => $2::float8 / 1000)",
    )
    .bind(consumer)
    .bind(retention_ms as f64)
    .execute(&mut *conn)
    .await?;
    Ok(r.rows_affected())
}

/// Whether the inbox holds (consumer, event): a check that two concurrent
/// copies of one event both pass (the `check-then-insert` pattern).
pub async fn inbox_has(conn: &mut PgConnection, consumer: &str, event_id: &str) -> Result<bool> {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM inbox_messages WHERE consumer_name = $1 AND event_id = $2",
    )
    .bind(consumer)
    .bind(event_id)
    .fetch_one(conn)
    .await?;
    Ok(n > 0)
}

/// The order service's transaction: the order row and, with an outbox, the
/// event to publish, committed together. False: the order was committed
/// before (a restarted service finds its request done), nothing written.
pub async fn commit_order(
    conn: &mut PgConnection,
    event_id: &str,
    order_id: &str,
    outbox_message: Option<&str>,
) -> Result<bool> {
    begin(conn).await?;
    let created = sqlx::query(
        "INSERT INTO service_orders (event_id, order_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
    )
    .bind(event_id)
    .bind(order_id)
    .execute(&mut *conn)
    .await?
    .rows_affected()
        == 1;
    if !created {
        rollback(conn).await?;
        return Ok(false);
    }
    if let Some(message_id) = outbox_message {
        add_to_outbox(conn, event_id, message_id).await?;
    }
    commit(conn).await?;
    Ok(true)
}

/// An outbox row: in the order's transaction, or (outbox-after-commit) on its own.
pub async fn add_to_outbox(
    conn: &mut PgConnection,
    event_id: &str,
    message_id: &str,
) -> Result<()> {
    sqlx::query("INSERT INTO service_outbox (event_id, message_id) VALUES ($1, $2)")
        .bind(event_id)
        .bind(message_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Whether the order of `event_id` is committed and no service applied or
/// rejected its event: what a reconciliation job publishes again.
pub async fn order_without_event(conn: &mut PgConnection, event_id: &str) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM service_orders WHERE event_id = $1) \
         AND NOT EXISTS (SELECT 1 FROM inventory_reservations WHERE event_id = $1) \
         AND NOT EXISTS (SELECT 1 FROM business_rejections WHERE event_id = $1)",
    )
    .bind(event_id)
    .fetch_one(conn)
    .await?)
}

/// The outbox rows not yet marked sent: their message ids and eventIds,
/// in commit order.
pub async fn unsent(conn: &mut PgConnection) -> Result<Vec<(String, String)>> {
    Ok(sqlx::query_as(
        "SELECT message_id, event_id FROM service_outbox WHERE sent_at IS NULL ORDER BY seq",
    )
    .fetch_all(conn)
    .await?)
}

/// The relay's mark after the broker confirmed the row's publish.
pub async fn mark_sent(conn: &mut PgConnection, message_id: &str) -> Result<()> {
    sqlx::query("UPDATE service_outbox SET sent_at = now() WHERE message_id = $1")
        .bind(message_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// An intent row (the downstream call the event owes) in the open
/// business transaction: committed with the business row or not at all.
pub async fn add_intent(
    conn: &mut PgConnection,
    service: &str,
    event_id: &str,
    meta: &str,
    body: &[u8],
) -> Result<()> {
    sqlx::query(
        "INSERT INTO consumer_intents (consumer_name, event_id, meta, body) VALUES ($1, $2, $3, $4)",
    )
    .bind(service)
    .bind(event_id)
    .bind(meta)
    .bind(body)
    .execute(conn)
    .await?;
    Ok(())
}

/// The service's intents not marked done, in commit order: each
/// (eventId, meta, body).
pub async fn pending_intents(
    conn: &mut PgConnection,
    service: &str,
) -> Result<Vec<(String, String, Vec<u8>)>> {
    Ok(sqlx::query_as(
        "SELECT event_id, meta, body FROM consumer_intents \
         WHERE consumer_name = $1 AND done_at IS NULL ORDER BY seq",
    )
    .bind(service)
    .fetch_all(conn)
    .await?)
}

/// The mark after an intent's call returned (autocommit).
pub async fn intent_done(conn: &mut PgConnection, service: &str, event_id: &str) -> Result<()> {
    sqlx::query(
        "UPDATE consumer_intents SET done_at = now() WHERE consumer_name = $1 AND event_id = $2",
    )
    .bind(service)
    .bind(event_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// The inbox row alone, committed at once (outside any open transaction).
pub async fn insert_inbox_autocommit(
    conn: &mut PgConnection,
    consumer: &str,
    event_id: &str,
) -> Result<bool> {
    insert_inbox(conn, consumer, event_id).await
}

pub async fn reserve_inventory(
    conn: &mut PgConnection,
    consumer: &str,
    message_id: &str,
    order: &OrderCreated,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO inventory_reservations (consumer_name, message_id, event_id, order_id, amount, currency) \
         VALUES ($1, $2, $3, $4, $5::numeric, $6)",
    )
    .bind(consumer)
    .bind(message_id)
    .bind(&order.event_id)
    .bind(&order.order_id)
    .bind(order.amount.to_string())
    .bind(&order.currency)
    .execute(conn)
    .await?;
    Ok(())
}

/// How an event sets its order's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateWrite {
    /// Only if the stored state allows it: a change event newer than the
    /// stored version, a conditional cancel while the status is the one
    /// it names.
    Guarded,
    /// Whatever the stored state: the last event to arrive wins.
    Overwrite,
}

/// Sets the order's state from a change event, in the open transaction:
/// Ok(None) when written, Ok(Some(stored version)) when the event is not
/// newer than the state (`Guarded` only).
pub async fn set_order_state(
    conn: &mut PgConnection,
    consumer: &str,
    order: &OrderCreated,
    version: i64,
    how: StateWrite,
) -> Result<Option<i64>> {
    let guard = match how {
        StateWrite::Guarded => " WHERE order_state.version < EXCLUDED.version",
        StateWrite::Overwrite => "",
    };
    let written = sqlx::query(&format!(
        "INSERT INTO order_state (consumer_name, order_id, version, amount, status) \
         VALUES ($1, $2, $3, $4::numeric, COALESCE($5, 'open')) \
         ON CONFLICT (consumer_name, order_id) \
         DO UPDATE SET version = EXCLUDED.version, amount = EXCLUDED.amount, \
         status = COALESCE($5, order_state.status){guard}"
    ))
    .bind(consumer)
    .bind(&order.order_id)
    .bind(version)
    .bind(order.amount.to_string())
    .bind(order.status.as_deref())
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if written == 1 {
        return Ok(None);
    }
    let (stored,): (i64,) = sqlx::query_as(
        "SELECT version FROM order_state WHERE consumer_name = $1 AND order_id = $2",
    )
    .bind(consumer)
    .bind(&order.order_id)
    .fetch_one(conn)
    .await?;
    Ok(Some(stored))
}

/// A delayed check's cancel, in the open transaction: Ok(None) when
/// cancelled, Ok(Some(the status found)) when the order is not in the
/// status the check names (`Guarded`), or has no state yet ([`ABSENT`],
/// either way). A cancel leaves the version as it is: a change event
/// newer than the last one still applies after it (not modelled).
pub async fn cancel_order_if(
    conn: &mut PgConnection,
    consumer: &str,
    order: &OrderCreated,
    expected: &str,
    how: StateWrite,
) -> Result<Option<String>> {
    let cancel = sqlx::query(
        "UPDATE order_state SET status = 'cancelled' \
         WHERE consumer_name = $1 AND order_id = $2 AND (status = $3 OR $4)",
    )
    .bind(consumer)
    .bind(&order.order_id)
    .bind(expected)
    .bind(how == StateWrite::Overwrite);
    let cancelled = cancel.execute(&mut *conn).await?.rows_affected();
    // Overwrite matches any status: 0 rows there means no state at all.
    if cancelled == 1 {
        return Ok(None);
    }
    let found: Option<(String,)> =
        sqlx::query_as("SELECT status FROM order_state WHERE consumer_name = $1 AND order_id = $2")
            .bind(consumer)
            .bind(&order.order_id)
            .fetch_optional(conn)
            .await?;
    Ok(Some(found.map_or_else(|| ABSENT.to_string(), |(s,)| s)))
}

/// What [`cancel_order_if`] finds for an order that has no state at all.
pub const ABSENT: &str = "absent";

/// What PostgreSQL holds after (or during) a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ground {
    /// One (service, eventId) pair per business row.
    pub business: Vec<(String, String)>,
    pub processed_rows: i64,
    /// One (service, eventId) pair per recorded business rejection: the
    /// event was handled, by saying no.
    #[serde(default)]
    pub rejected: Vec<(String, String)>,
    /// One (service, orderId, version, status) per order state a change
    /// event set; `None` when not read (a program keeps its own tables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub states: Option<Vec<(String, String, i64, String)>>,
    /// The eventId of each order the harness's order service committed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub orders: Vec<String>,
}

impl Ground {
    pub fn field(&self, f: InspectField) -> i64 {
        match f {
            InspectField::BusinessRows => self.business.len() as i64,
            InspectField::ProcessedRows => self.processed_rows,
            InspectField::RejectionRows => self.rejected.len() as i64,
        }
    }
}

/// The ground truth; `effects`: a program's own query for its business
/// effects, `(service, eventId)` rows, instead of the built-in table.
pub async fn read_ground(conn: &mut PgConnection, effects: Option<&str>) -> Result<Ground> {
    let business = match effects {
        Some(sql) => program_effects(conn, sql).await?,
        None => {
            sqlx::query_as("SELECT consumer_name, event_id FROM inventory_reservations ORDER BY id")
                .fetch_all(&mut *conn)
                .await?
        }
    };
    let (processed_rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM inbox_messages")
        .fetch_one(&mut *conn)
        .await?;
    let rejected: Vec<(String, String)> =
        sqlx::query_as("SELECT consumer_name, event_id FROM business_rejections ORDER BY id")
            .fetch_all(&mut *conn)
            .await?;
    // A program's own tables hold its state, which the lab cannot read.
    let states = match effects {
        Some(_) => None,
        None => Some(
            sqlx::query_as(
                "SELECT consumer_name, order_id, version, status FROM order_state \
                 ORDER BY consumer_name, order_id",
            )
            .fetch_all(&mut *conn)
            .await?,
        ),
    };
    let orders =
        sqlx::query_scalar("SELECT event_id FROM service_orders ORDER BY created_at, event_id")
            .fetch_all(&mut *conn)
            .await?;
    Ok(Ground {
        business,
        processed_rows,
        rejected,
        states,
        orders,
    })
}

/// A program's business effects by the lab's query. Before the program
/// created its tables there are none (undefined_table reads as empty).
async fn program_effects(conn: &mut PgConnection, sql: &str) -> Result<Vec<(String, String)>> {
    match sqlx::query_as::<_, (String, String)>(sql)
        .fetch_all(&mut *conn)
        .await
    {
        Ok(rows) => Ok(rows),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("the lab's effects query `{sql}`")),
    }
}

/// Business rows of one event, by a program's effects query.
pub async fn program_rows_for(conn: &mut PgConnection, sql: &str, event_id: &str) -> Result<i64> {
    Ok(program_effects(conn, sql)
        .await?
        .iter()
        .filter(|(_, e)| e == event_id)
        .count() as i64)
}

pub async fn business_rows_for(conn: &mut PgConnection, message_id: &str) -> Result<i64> {
    let (n,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM inventory_reservations WHERE message_id = $1")
            .bind(message_id)
            .fetch_one(conn)
            .await?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::content;

    /// Every file of `migrations/` is embedded, under the version and
    /// description its name gives, in order: a new one cannot be forgotten.
    #[test]
    fn every_migration_file_is_embedded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let embedded: Vec<String> = super::MIGRATIONS
            .iter()
            .map(|(v, d, _)| format!("{v:04}_{}.sql", d.replace(' ', "_")))
            .collect();
        assert_eq!(embedded, files);
    }

    #[test]
    fn content_ignores_key_order_and_whitespace_but_not_values() {
        let a = br#"{"eventId":"E1","amount":199.0,"currency":"CNY"}"#;
        let b = br#"{ "currency": "CNY", "amount": 199.0, "eventId": "E1" }"#;
        let c = br#"{"eventId":"E1","amount":299.0,"currency":"CNY"}"#;
        assert_eq!(content(a), content(b));
        assert_ne!(content(a), content(c));
        // Not JSON: the bytes themselves, so two different ones differ.
        assert_ne!(content(b"\xff\x01"), content(b"\xfe\x01"));
    }
}
