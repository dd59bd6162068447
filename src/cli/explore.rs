//! `mqlab explore`: every fault point of one lab run in turn, judged by
//! the checker, printed as a matrix.

use std::time::Instant;

use anyhow::Context;

use super::{progress, setup, EXPLORE_VHOST};
use crate::error::{Error, UsageContext};
use crate::events::{Event, Sink};
use crate::evidence;
use crate::exit;
use crate::explore::{Point, Verdict};
use crate::lab::{Lab, Project};
use crate::runner::Suite;
use crate::session::{EnvKind, Session};
use crate::sinks::{self, out};

use super::args::ExploreArgs;

/// The lab `explore` is asked for (its run name and definition, the
/// program put in when `--consumer-cmd` is given); a usage error for a
/// cluster lab or a command for a lab that runs no program.
fn explore_lab(project: &Project, args: &ExploreArgs) -> Result<(String, Lab), Error> {
    let run = match &args.variant {
        Some(v) => format!("{}@{v}", args.lab),
        None => args.lab.clone(),
    };
    let mut lab = project.load(&run).usage()?;
    if lab.is_cluster() {
        return Err(Error::Usage(anyhow::anyhow!(
            "`{run}` runs on a three-node cluster: explore runs one-node labs (`mqlab lab --group cluster` runs the cluster labs)"
        )));
    }
    if let Some(cmd) = &args.consumer_cmd {
        if !lab.set_command(cmd) {
            return Err(Error::Usage(anyhow::anyhow!(
                "lab `{run}` runs no program: --consumer-cmd replaces the `command` of a consume step"
            )));
        }
    }
    Ok((run, lab))
}

pub(super) fn cmd_explore(project: &Project, args: ExploreArgs) -> Result<i32, Error> {
    if matches!(args.env.env, EnvKind::External) {
        return Err(Error::Usage(anyhow::anyhow!(
            "explore runs on --env local or containers: its points restart the broker"
        )));
    }
    let (run, lab) = explore_lab(project, &args)?;
    super::own_databases_possible(std::slice::from_ref(&lab))?;
    if let Some(dir) = &args.evidence {
        evidence::prepare_dir(dir).usage()?;
    }
    let setup = setup(project, &args.env, vec![EXPLORE_VHOST.into()])?;
    let terminal = sinks::Terminal::new(project.snapshots_dir());
    let mut session = Session::open(setup, progress(&terminal))?;
    // The points' transcripts are not printed: the matrix is the output.
    let mut sink = sinks::Terminal::quiet(terminal);
    let started = Instant::now();
    let mut results = Vec::new();
    let (exe, run_dir) = (session.exe().to_path_buf(), session.run_dir().to_path_buf());
    let ended = session.run(&mut sink, std::slice::from_ref(&lab), async |env, sink| {
        let mut suite = Suite {
            project,
            env,
            exe: &exe,
            run_dir: &run_dir,
            update: false,
            vhost: Some(EXPLORE_VHOST.into()),
            checks_only: true,
            jobs: 1,
            settings: Default::default(),
        };
        explore_all(&mut suite, (&lab, &run), &args, sink, &mut results).await
    });
    if ended.is_ok() {
        sink.tell(&Event::SuiteFinished {
            records: &[],
            wall: started.elapsed(),
        });
    }
    session.close(false);
    let mismatched = match ended?.into_result()? {
        Ok(n) => n,
        Err(e) => return Ok(no_clean_run(&lab, &run, &e)),
    };
    let code = explore_report(&args, &run, &lab.claim, &results, started)?;
    // The code and its pattern differ: no verdict of the points stands.
    if mismatched > 0 {
        eprintln!("mqlab: {run}: the built-in consumer's clean run and its pattern differ ({mismatched} windows): explore fails");
        return Ok(exit::LAB_FAILED);
    }
    Ok(code)
}

/// The clean run failed: no point can be judged.
fn no_clean_run(lab: &Lab, run: &str, e: &str) -> i32 {
    let who = match lab
        .steps
        .iter()
        .any(|s| matches!(&s.action, crate::lab::Action::Consume(c) if c.command.is_some()))
    {
        true => "the program fails",
        false => "it fails",
    };
    eprintln!("mqlab: {run}: {who} the lab with no fault injected, so no point can be judged: {e}");
    exit::LAB_FAILED
}

/// The clean run, then the points as it showed them: a mismatch between
/// the built-in consumer's code and its pattern is an error row each (how
/// many: the count); Err when the clean run itself failed.
async fn explore_all(
    suite: &mut Suite<'_>,
    (lab, run): (&Lab, &str),
    args: &ExploreArgs,
    sink: &mut dyn Sink,
    results: &mut Vec<(Point, Verdict)>,
) -> Result<usize, String> {
    // A clean run first: the windows the built-in consumer really passes
    // are the points; a program that cannot get through the lab at all
    // says so once, not at every point.
    let clean = crate::explore::baseline(lab);
    let record = suite.run_one(&clean, sink).await;
    if let Verdict::Error(e) = Verdict::of(&record) {
        return Err(e);
    }
    let passed = crate::explore::Passed::of(&record.transcript);
    let mismatches = crate::explore::mismatches(lab, &passed);
    let mismatched = mismatches.len();
    for (w, mid, why) in mismatches {
        let column = match mid.as_str() {
            "-" => "clean run".to_string(),
            m => m.to_string(),
        };
        let row = format!("consumer/{w}");
        let lab = clean.clone();
        results.push((Point { row, column, lab }, Verdict::Error(why)));
    }
    let (points, total) = chosen(args, lab, &passed);
    if let Some(p) = args.partition.as_ref().filter(|_| points.is_empty()) {
        eprintln!("mqlab: partition {p} of {run}'s points holds none; nothing to run");
        return Ok(mismatched);
    }
    eprintln!(
        "mqlab: exploring {run}: {} of {total} fault points (judged by {})",
        points.len(),
        crate::explore::judged_by(lab)
    );
    run_points(suite, points, sink, results).await;
    Ok(mismatched)
}

/// The points to run (all of the lab's, as the clean run `passed` its
/// windows, a sample of them, this partition's share) and how many the
/// lab has.
fn chosen(args: &ExploreArgs, lab: &Lab, passed: &crate::explore::Passed) -> (Vec<Point>, usize) {
    let all = crate::explore::points_with(lab, Some(passed));
    let total = all.len();
    let mut points = match args.points {
        Some(n) => crate::explore::sample(all, n, args.seed),
        None => all,
    };
    if let Some(p) = &args.partition {
        points = p.share(points, |p| format!("{} {}", p.row, p.column));
    }
    (points, total)
}

/// Each point in turn, judged; a program's next COMMIT of a message is
/// tried right after the point that reached the one before.
async fn run_points(
    suite: &mut Suite<'_>,
    points: Vec<Point>,
    sink: &mut dyn Sink,
    results: &mut Vec<(Point, Verdict)>,
) {
    let mut total = points.len();
    let mut queue: std::collections::VecDeque<_> = points.into();
    let mut i = 0;
    while let Some(p) = queue.pop_front() {
        let name = format!("{} {}", p.row, p.column);
        sink.tell(&Event::LabStarted {
            run: &name,
            index: i,
            total,
        });
        i += 1;
        let record = suite.run_one(&p.lab, sink).await;
        let verdict = Verdict::of(&record);
        if let Some(next) = crate::explore::next_commit(&p, &verdict) {
            queue.push_front(next);
            total += 1;
        }
        results.push((p, verdict));
    }
}

/// What `mqlab explore` prints and writes once its points ran: the matrix,
/// the findings, the summary, the matrix page, and the verdict's exit code.
fn explore_report(
    args: &ExploreArgs,
    run: &str,
    claim: &str,
    results: &[(Point, Verdict)],
    started: Instant,
) -> Result<i32, Error> {
    let tally = crate::explore::Tally::of(results);
    let summary = tally.summary(started.elapsed().as_secs_f64());
    out(&crate::explore::render_text(results));
    for line in crate::explore::findings(results) {
        out(&line);
    }
    out(&summary);
    if let Some(dir) = &args.evidence {
        // Each share its own page: shares upload side by side.
        let file = match &args.partition {
            Some(p) => dir.join(format!("explore-{run}-{}of{}.md", p.k, p.n)),
            None => dir.join(format!("explore-{run}.md")),
        };
        std::fs::write(
            &file,
            crate::explore::render_markdown(run, claim, results, &summary),
        )
        .with_context(|| format!("cannot write `{}`", file.display()))
        .usage()?;
        eprintln!("mqlab: matrix written to {}", file.display());
    }
    let counterexample = args.variant.is_some() || run.contains('@');
    let (code, note) = tally.exit_code(counterexample, args.partition.is_some());
    if let Some(note) = note {
        eprintln!("mqlab: {note}");
    }
    Ok(code)
}
