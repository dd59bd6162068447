//! A broker's nodes, as the waits see them: one node (local, containers)
//! or a cluster's three (local processes, containers). What a node is
//! (a child process, a container) is each environment's own; what the
//! harness waits for on nodes (metadata on disk, a quorum leader elsewhere,
//! a node paused by its minority, nodes answering again) and what the
//! node faults do in order (restart: kill if it runs, start, wait; a
//! partition: record and cut, wait until paused; heal: uncut, wait) are
//! written here, once, over [`Nodes`]; an environment implements only the
//! primitives.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The RabbitMQ nodes of one environment, node 1 first: its servers
/// ([`Server`]), and what a RabbitMQ node adds.
#[allow(async_fn_in_trait)] // used generically, never as `dyn`
pub trait Nodes: Server {
    /// Node n's Erlang name, as the other nodes know it.
    fn name(&self, n: usize) -> String;
    /// `rabbitmqctl eval EXPR` on node n: its printed answer, trimmed.
    async fn eval(&self, n: usize, expr: &str) -> Result<String>;
    /// Whether node n's broker has stopped serving (pause_minority), as this
    /// environment can see it: its AMQP port refuses (local), or the node
    /// says `rabbit:is_running()` is false (a container's port mapping
    /// accepts connections whatever the broker does).
    async fn stopped(&self, n: usize) -> Result<bool>;
    /// Drops node n's traffic to and from every other node; AMQP from the
    /// harness still reaches it. What it adds is recorded first, so a
    /// failure half way is still removed by [`Nodes::uncut`].
    async fn cut(&mut self, n: usize) -> Result<()>;
    /// Removes every cut; the nodes that were cut off.
    async fn uncut(&mut self) -> Result<Vec<usize>>;
}

use super::server::in_range;
pub use super::server::{restart, Server};

/// Sets a policy as `rabbitmqctl set_policy` does (`rabbit_policy:parse_set`,
/// the definition as JSON) with a pattern that matches exactly one queue,
/// then waits until that queue reports the policy: a queue learns of a new
/// or changed policy after the call returns.
pub async fn set_policy(nodes: &impl Nodes, p: &super::PolicyRequest<'_>) -> Result<()> {
    let pattern = format!("^{}$", regex_escaped(p.queue));
    let set = format!(
        "rabbit_policy:parse_set({}, {}, {}, {}, 0, {}, {}).",
        erlang_binary(p.vhost),
        erlang_binary(p.name),
        erlang_binary(&pattern),
        erlang_binary(p.definition),
        erlang_binary("queues"),
        erlang_binary("mqlab")
    );
    let answer = nodes.eval(1, &set).await?;
    if answer != "ok" {
        bail!("setting the policy `{}` on `{}`: {answer}", p.name, p.queue);
    }
    // The queue's process reports this policy and exactly this definition
    // in force (a map on 4.0, a list on 3.10): a changed policy that drops
    // a key is not taken for the old one.
    let in_force = format!(
        "{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r({}, queue, {})), \
         [{{policy, N}}, {{effective_policy_definition, D}}] = rabbit_amqqueue:info(Q, [policy, effective_policy_definition]), \
         Have = case D of M when is_map(M) -> M; L -> maps:from_list(L) end, \
         N =:= {} andalso Have =:= rabbit_json:decode({}).",
        erlang_binary(p.vhost),
        erlang_binary(p.queue),
        erlang_binary(p.name),
        erlang_binary(p.definition)
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    poll_eval(deadline, "true", || nodes.eval(1, &in_force))
        .await
        .map_err(|last| {
            anyhow::anyhow!(
                "the policy `{}` was not in force on `{}` within 10 s: {last}",
                p.name,
                p.queue
            )
        })
}

/// What a classic queue's own process reports now, beside the ready count
/// (AMQP's passive declare gives that alone): what a backlog monitor
/// should read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// Messages delivered to consumers and not yet acked.
    pub unacked: u32,
    /// The `timestamp` property (seconds) of its oldest message, delivered
    /// and unacked ones included (`head_message_timestamp`); `None` when
    /// that message has none.
    pub oldest_stamp: Option<u64>,
}

/// Reads [`Held`]. Another queue type answers its type: a quorum queue's
/// count is a statistic its leader refreshes periodically, and a node
/// without it reads 0, so it is refused, never read.
pub async fn held(nodes: &impl Nodes, vhost: &str, queue: &str) -> Result<Held> {
    let answer = by_queue_type(
        nodes,
        vhost,
        queue,
        "rabbit_classic_queue -> \
           [{_, U}, {_, T}] = rabbit_amqqueue:info(Q, [messages_unacknowledged, head_message_timestamp]), \
           {U, T};",
    )
    .await?;
    parse_held(&answer).ok_or_else(|| {
        anyhow::anyhow!(
            "the figures of `{queue}` are read from a classic queue's own process; the broker answered {answer}"
        )
    })
}

/// How many messages a queue still holds in any state: ready, delivered
/// and not acked, and (a quorum queue with at-least-once dead-lettering)
/// waiting for its dead-letter target to take them. Read from a classic
/// queue's own process or a quorum queue's leader state, never from a
/// statistic: 0 means the queue can dead-letter nothing more.
pub async fn holds(nodes: &impl Nodes, vhost: &str, queue: &str) -> Result<u64> {
    let answer = by_queue_type(
        nodes,
        vhost,
        queue,
        "rabbit_classic_queue -> [{_, N}] = rabbit_amqqueue:info(Q, [messages]), N; \
         rabbit_quorum_queue -> \
           {ok, {_, N}, _} = ra:leader_query(amqqueue:get_pid(Q), fun rabbit_fifo:query_messages_total/1), N;",
    )
    .await?;
    parse_holds(&answer).ok_or_else(|| {
        anyhow::anyhow!(
            "what `{queue}` holds is read from a classic queue's process or a quorum queue's leader; the broker answered {answer}"
        )
    })
}

/// Node 1's answer to `branches` (Erlang `case` clauses over the queue's
/// type, with the queue bound to `Q`) for one queue of `vhost`; a type no
/// clause names answers itself.
async fn by_queue_type(
    nodes: &impl Nodes,
    vhost: &str,
    queue: &str,
    branches: &str,
) -> Result<String> {
    let read = format!(
        "{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r({}, queue, {})), \
         case amqqueue:get_type(Q) of {branches} T -> T end.",
        erlang_binary(vhost),
        erlang_binary(queue)
    );
    nodes.eval(1, &read).await
}

/// `3`; another queue type answers its type (`rabbit_stream_queue`).
fn parse_holds(answer: &str) -> Option<u64> {
    answer.trim().parse().ok()
}

/// `{5,1733350000}`, or `{5,''}` when the oldest message has no stamp.
fn parse_held(answer: &str) -> Option<Held> {
    let (u, t) = answer
        .trim()
        .strip_prefix('{')?
        .strip_suffix('}')?
        .split_once(',')?;
    Some(Held {
        unacked: u.trim().parse().ok()?,
        oldest_stamp: match t.trim() {
            "''" => None,
            t => Some(t.parse().ok()?),
        },
    })
}

/// A string as an Erlang binary of its bytes, for `rabbitmqctl eval`: no
/// quote or backslash, which a container's rabbitmqctl (Debian's wrapper,
/// through `su -c`) would mangle.
fn erlang_binary(s: &str) -> String {
    let bytes: Vec<String> = s.bytes().map(|b| b.to_string()).collect();
    format!("<<{}>>", bytes.join(","))
}

/// Deletes vhosts whose runs ended (with their queues and messages): a
/// broker restarted later recovers only what is left. Measured on a local
/// 3.10.8 node after `lab --all`'s concurrent runs (86 vhosts): a broker
/// restart took 11-12 s, 8 s once they were deleted, 6.5 s with one vhost.
pub async fn delete_vhosts(nodes: &impl Nodes, vhosts: &[String]) -> Result<()> {
    if vhosts.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = vhosts.iter().map(|v| erlang_binary(v)).collect();
    let expr = format!(
        "lists:usort([rabbit_vhost:delete(V, {}) || V <- [{}]]).",
        erlang_binary("mqlab"),
        list.join(",")
    );
    // An error names the expression: its vhosts as byte lists, kilobytes.
    let answer = nodes.eval(1, &expr).await.map_err(|e| {
        anyhow::anyhow!(
            "deleting the {} vhosts of ended runs: {}",
            vhosts.len(),
            format!("{e:#}").replace(&expr, "<the deletion>")
        )
    })?;
    if answer != "[ok]" {
        bail!(
            "deleting the {} vhosts of ended runs: {answer}",
            vhosts.len()
        );
    }
    Ok(())
}

/// `name` as a regular expression that matches only itself.
fn regex_escaped(name: &str) -> String {
    name.chars()
        .flat_map(|c| match c {
            '.' | '^' | '$' | '|' | '?' | '*' | '+' | '(' | ')' | '[' | ']' | '{' | '}' | '\\' => {
                vec!['\\', c]
            }
            c => vec![c],
        })
        .collect()
}

/// Cuts node n off from the others and waits until it has paused.
pub async fn partition(nodes: &mut impl Nodes, n: usize) -> Result<()> {
    in_range(nodes, n)?;
    nodes.cut(n).await?;
    await_paused(nodes, n).await
}

/// Ends every cut and waits until the nodes that were cut off answer again.
/// A paused node answers only once it has found the majority again (its
/// distribution reconnected) and restarted its broker: a boot and more, so
/// three ready timeouts. On 2026-12-06's fourth machine (2 slow cores),
/// 3.10 nodes in containers took longer than the 60 s default after a
/// heal in both CI runs of `tests/containers.rs`' cluster group.
pub async fn heal(nodes: &mut impl Nodes) -> Result<()> {
    let cut = nodes.uncut().await?;
    let deadline = Instant::now() + nodes.ready_timeout() * 3;
    await_healed(nodes, &cut, deadline).await
}

/// Whether `url` takes an AMQP connection by `deadline`, asked every
/// 100 ms: how every environment waits for a node to answer.
pub async fn answers_amqp(url: &str, deadline: Instant) -> bool {
    loop {
        if crate::broker::rabbitmq::answers(url).await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// PostgreSQL's version once `url` takes a connection, asked every 50 ms;
/// `None` by `deadline`.
pub async fn answers_postgres(url: &str, deadline: Instant) -> Result<Option<String>> {
    loop {
        if let Ok(mut c) = crate::store::connect(url).await {
            return crate::store::server_version(&mut c).await.map(Some);
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Node n writes its metadata log (mnesia's, where a queue's declaration
/// lives) to disk now. mnesia logs a commit asynchronously: measured, a
/// durable queue declared a few ms before a SIGKILL was gone after the
/// restart, with its confirmed persistent messages (2 of 42 warm
/// broker-restart runs). A lab that kills the broker declares its queues,
/// then syncs, so the crash tests the messages, not the declaration.
///
/// And its dets tables: Ra's name registry (`names.dets`, which maps a
/// quorum queue to its member's directory) is saved every 500 ms. Measured
/// on 3.10.8 and 4.0.5, one node SIGKILLed about 0.3 s after declaring a
/// quorum queue: after the restart the registry was empty, RabbitMQ started
/// a new, empty member beside the old one's directory (its log intact), the
/// new member was never elected, and basic.get timed out after 65 s.
pub async fn sync_metadata(nodes: &impl Nodes, n: usize) -> Result<()> {
    if !nodes.running(n).await {
        bail!("node {n} is not running");
    }
    const SYNC: &str =
        "mnesia:sync_log(), lists:foreach(fun(T) -> ok = dets:sync(T) end, dets:all()).";
    let out = nodes.eval(n, SYNC).await?;
    if out != "ok" {
        bail!("`rabbitmqctl eval {SYNC}` on node {n} answered: {out}");
    }
    Ok(())
}

/// Whether node n finds a classic queue's process on one of the nodes
/// `faulted` (those the lab holds down or cut off) and out of reach: node n
/// asks that node whether the process is alive, 2 s at most. A passive
/// declare of such a queue is answered "home node down" at once by 3.10
/// and only after about 60 s by 4.0 (it retries the dead process:
/// `broker::rabbitmq::client::queue_state`); this asks the same question
/// without the retries. A process on a node the lab left alone, a queue of
/// another type, or none: false (the broker is asked).
pub async fn home_down(
    nodes: &impl Nodes,
    n: usize,
    vhost: &str,
    queue: &str,
    faulted: &[usize],
) -> Result<bool> {
    let names: Vec<String> = faulted
        .iter()
        .map(|m| format!("'{}'", nodes.name(*m)))
        .collect();
    let expr = format!(
        "case rabbit_amqqueue:lookup(rabbit_misc:r({}, queue, {})) of \
         {{ok, Q}} -> case amqqueue:get_type(Q) of \
         rabbit_classic_queue -> P = amqqueue:get_pid(Q), \
         lists:member(node(P), [{}]) andalso \
         rpc:call(node(P), erlang, is_process_alive, [P], 2000) =/= true; \
         _ -> false end; _ -> false end.",
        erlang_binary(vhost),
        erlang_binary(queue),
        names.join(", ")
    );
    match nodes.eval(n, &expr).await?.as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        other => {
            bail!("node {n}, asked whether `{queue}`'s process is out of reach, answered {other}")
        }
    }
}

/// Waits until a running node other than `gone` names a leader of the
/// quorum queue other than `gone` (ra:members goes through the leader that
/// node knows, or waits while there is none). Measured: a publish sent to
/// node 2 before the election ended was nacked, again and again. `gone`
/// 0: no node is gone, any leader will do (after a one-node restart: a
/// quorum queue's member is elected some time after the node answers, and
/// its depth reads 0 until then, measured on 3.10.8). One node with a node
/// gone: nothing to wait for.
pub async fn await_leader(
    nodes: &impl Nodes,
    gone: usize,
    vhost: &str,
    queue: &str,
    deadline: Instant,
) -> Result<()> {
    if nodes.count() < 2 && gone != 0 {
        return Ok(());
    }
    let mut asked = None;
    for m in (1..=nodes.count()).filter(|m| *m != gone) {
        if nodes.running(m).await {
            asked = Some(m);
            break;
        }
    }
    let m = asked.context("no other node is running")?;
    let not = match gone {
        0 => "none".to_string(),
        n => nodes.name(n),
    };
    let expr = leader_elsewhere(vhost, queue, &not);
    poll_eval(deadline, "true", || nodes.eval(m, &expr))
        .await
        .map_err(|seen| {
            anyhow::anyhow!(
                "node {m} names no leader of `{queue}` but the killed node by the step's deadline ({seen})"
            )
        })
}

/// Waits until node n, cut off, has paused itself (pause_minority stops its
/// broker once it sees itself in a minority: about net_ticktime, 10 s,
/// after the cut) and every other running node has seen it go. Measured: a
/// publish on node 2 sent after node 1 paused but before node 2 noticed
/// (1 s later, under load) was nacked, and so was every resend on that
/// channel for 35 s. Each node's checks, and the pause, have 60 s of their
/// own (at most 180 s in all on three nodes): with one shared deadline, CI
/// once failed on node 3's monitor "still counting node 1", its last eval
/// cut off by the deadline, on a machine loaded by a second container
/// run (how long each eval took there was not timed).
pub async fn await_paused(nodes: &impl Nodes, n: usize) -> Result<()> {
    let gone = format!("lists:member('{}', nodes()).", nodes.name(n));
    for m in (1..=nodes.count()).filter(|m| *m != n) {
        if !nodes.running(m).await {
            continue;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        if let Err(seen) = poll_eval(deadline, "false", || nodes.eval(m, &gone)).await {
            bail!("node {m} still sees node {n}, cut off, after 60 s of asking ({seen})");
        }
        // Until node m's rabbit_node_monitor has handled node n's `DOWN`:
        // its handler writes the cluster status without node n, then runs
        // handle_dead_rabbit, which runs rabbit_amqqueue:on_node_down
        // (3.10.8's beam, read). So: node n gone from the status it wrote,
        // then a call to the monitor (partitions/0 is a gen_server:call),
        // answered only once that handler is done. Without it a publish
        // right after the step could still route to node n's classic
        // queue and be nacked where 3.10 confirms (seen once in
        // containers: quorum-partition@classic-queue, confirmed=2).
        let name = nodes.name(n);
        let written = format!(
            "not lists:member('{name}', element(3, rabbit_node_monitor:read_cluster_status()))."
        );
        if let Err(seen) = poll_eval(deadline, "true", || nodes.eval(m, &written)).await {
            bail!("node {m}'s node monitor still counts node {n}, cut off, running after 60 s of asking ({seen})");
        }
        let handled = "is_list(rabbit_node_monitor:partitions()).";
        if let Err(seen) = poll_eval(deadline, "true", || nodes.eval(m, handled)).await {
            bail!("node {m}'s node monitor did not answer within 60 s after node {n} was cut off and it saw so ({seen})");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if !nodes.running(n).await {
            bail!("node {n} is not running: it was cut off, not killed");
        }
        // Each answer by the deadline: a slow `docker exec` is "not yet".
        let stopped = tokio::time::timeout_at(deadline.into(), nodes.stopped(n)).await;
        if matches!(stopped, Ok(Ok(true))) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("node {n}, cut off, still serves after 60 s of asking once the others saw it go: it did not pause (pause_minority) ({stopped:?})");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the nodes that were cut off and still run answer AMQP again
/// (a paused node restarts its broker once it sees the majority). A node
/// that has not answered within [`SYNC_HUNG_AFTER`] is checked for a hung
/// `global:sync` ([`unblock_global`]) and waited for again.
pub async fn await_healed(nodes: &impl Nodes, cut: &[usize], deadline: Instant) -> Result<()> {
    for &n in cut {
        // A node killed while cut off has nothing to come back.
        if !nodes.running(n).await {
            continue;
        }
        // A failing or slow eval is "not yet": the wait goes on to its
        // deadline, and the last such failure is told with the timeout.
        let mut unblocking = None;
        loop {
            let step = (Instant::now() + SYNC_HUNG_AFTER).min(deadline);
            match nodes.ready(n, step).await {
                Ok(()) => break,
                Err(e) if Instant::now() >= deadline => {
                    return Err(match unblocking {
                        Some(u) => anyhow::anyhow!(
                        "{e:#}\n(the last look for a hung global:sync on node {n} failed: {u:#})"
                    ),
                        None => e,
                    })
                }
                Err(_) => {
                    let tried = tokio::time::timeout_at(deadline.into(), unblock_global(nodes, n));
                    unblocking = match tried.await {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(e),
                        Err(_) => Some(anyhow::anyhow!("no answer by the deadline")),
                    };
                    // Never a busy loop: a `ready` that failed at once waits
                    // out its step here.
                    tokio::time::sleep_until(step.into()).await;
                }
            }
        }
    }
    Ok(())
}

/// How long a healed node may take to answer before the harness looks for
/// a hung `global:sync`: RabbitMQ's own workaround looks after 10 s.
const SYNC_HUNG_AFTER: Duration = Duration::from_secs(20);

/// What RabbitMQ 3.10.9 and later do when `global:sync` hangs, which 3.10.8
/// on Erlang 25 cannot: a peer whose sync tag in `global_name_server` is
/// the same after 10 s is sent nodedown and nodeup on both sides, so both
/// restart their sync. A paused node restarting its broker after a heal
/// calls `global:sync` (`rabbit_node_monitor:global_sync`). 3.10.8's
/// workaround sends two-element messages, which Erlang 25.1's `global`
/// and later drop ("The global_name_server received an unexpected message:
/// handle_info({nodedown, ...})"): the sync never returned and node 1 never
/// answered again, seen in two CI runs of the containers' cluster group
/// (quorum-partition@classic-queue). rabbitmq-server#6046 (in 3.10.9) sends
/// the three-element form, `{nodedown, Node, Info}` and `{nodeup, Node,
/// #{connection_id => Id}}`, each side's current connection id; this sends
/// the same. A fake nodedown is harmless only because RabbitMQ starts
/// Erlang with `prevent_overlapping_partitions false` (3.10.8's
/// `sbin/rabbitmq-server`): with it on, `global` would tell the third node
/// of a lost connection and disconnect real peers. A node whose sync moves
/// or has none is left alone; a peer whose connection id either side lacks
/// is named as skipped. On 4.0.5, whose own workaround works, this would
/// only repeat it.
async fn unblock_global(nodes: &impl Nodes, n: usize) -> Result<()> {
    const TAGS: &str = "{dictionary, D} = process_info(whereis(global_name_server), dictionary), \
         lists:sort([{P, T} || {{sync_tag_his, P}, T} <- D]).";
    let before = nodes.eval(n, TAGS).await?;
    // The same rule as RabbitMQ's: unchanged over 10 s is hung.
    tokio::time::sleep(Duration::from_secs(10)).await;
    // Each peer's ids read before anything is sent to it, and a peer that
    // cannot be read is named, not a reason to stop half way.
    let expr = format!(
        "Before = {before}, {{dictionary, D}} = process_info(whereis(global_name_server), dictionary), \
         Stuck = [P || {{{{sync_tag_his, P}}, T}} <- D, lists:member({{P, T}}, Before)], \
         Id = fun(N, On) -> maps:get({{connection_id, N}}, \
                element(3, erpc:call(On, sys, get_state, [global_name_server], 5000)), none) end, \
         [case catch {{Id(P, node()), Id(node(), P)}} of \
            {{Mine, His}} when is_integer(Mine), is_integer(His) -> \
                global_name_server ! {{nodedown, P, #{{}}}}, \
                {{global_name_server, P}} ! {{nodedown, node(), #{{}}}}, \
                global_name_server ! {{nodeup, P, #{{connection_id => Mine}}}}, \
                {{global_name_server, P}} ! {{nodeup, node(), #{{connection_id => His}}}}, P; \
            _ -> {{skipped, P}} end || P <- Stuck]."
    );
    let stuck = nodes.eval(n, &expr).await?;
    if stuck != "[]" {
        eprintln!(
            "mqlab: node {n}'s global:sync hung after the heal: sent nodedown and nodeup in the \
             form Erlang 25.1's global takes, as RabbitMQ 3.10.9's workaround does, to each peer \
             named (a peer `{{skipped, P}}` had no connection id to send): {stuck}"
        );
    }
    Ok(())
}

/// An Erlang expression for `rabbitmqctl eval` on a running node: `true`
/// once the quorum queue's leader, as that node's ra server finds it, is a
/// node other than `gone` (a node name, unquoted).
pub(super) fn leader_elsewhere(vhost: &str, queue: &str, gone: &str) -> String {
    format!(
        "case rabbit_amqqueue:lookup(rabbit_misc:r(<<\"{vhost}\">>, queue, <<\"{queue}\">>)) of \
         {{ok, Q}} -> case amqqueue:get_pid(Q) of \
         {{Name, _}} -> case ra:members({{Name, node()}}, 2000) of {{ok, _, {{_, L}}}} -> L =/= '{gone}'; _ -> false end; \
         _ -> false end; _ -> false end."
    )
}

/// Asks `eval` (a `rabbitmqctl eval`) every 200 ms until it answers `want`
/// or `deadline` passes; a failing or slow eval (a loaded machine) counts as
/// "not yet". The error is the last answer, for the caller's message.
async fn poll_eval<F, Fut>(
    deadline: std::time::Instant,
    want: &str,
    mut eval: F,
) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<String>>,
{
    loop {
        let seen = tokio::time::timeout_at(deadline.into(), eval()).await;
        if matches!(&seen, Ok(Ok(out)) if out == want) {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("{seen:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_is_read_from_the_queue_process_answer() {
        assert_eq!(
            parse_held("{5,1733350000}"),
            Some(Held {
                unacked: 5,
                oldest_stamp: Some(1733350000)
            })
        );
        assert_eq!(
            parse_held("{0,''}\n"),
            Some(Held {
                unacked: 0,
                oldest_stamp: None
            })
        );
        // A quorum queue answers its type: never a figure.
        assert_eq!(parse_held("rabbit_quorum_queue"), None);
    }

    #[test]
    fn holds_is_a_count_or_nothing() {
        assert_eq!(parse_holds("0"), Some(0));
        assert_eq!(parse_holds("3\n"), Some(3));
        // A stream queue answers its type: never a count.
        assert_eq!(parse_holds("rabbit_stream_queue"), None);
    }
}
