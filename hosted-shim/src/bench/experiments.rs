//! The scenarios that report more than time: fragmentation after churn ([`super::churn`]),
//! host and guests ([`super::guests`]) and `hot_add` latency ([`super::hotadd`]). Each runs
//! once per allocator (no calibration, no samples), so they are not criterion cells; the
//! runner calls [`run`] after the timed groups.
#![deny(unsafe_code)]

use std::io;
use std::time::Duration;

use bitmap_allocator::{BitAlloc, BitAlloc1M, BitAlloc16M};
use numaframe::{AllocFlags, NodeId, PAGE_SIZE};
use serde_json::{Map, Value, json};

use super::oracle::Oracle;
use super::{
    Bitmap, Buddy, Measurement, NODE_BASE, NumaCpu, NumaNode, OneNode, Report, churn, guests,
    hotadd, name, offline, reporting, scenario, teardown,
};

/// How big the experiments are.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Frames of the churn node.
    pub churn_frames: u64,
    /// Churn rounds.
    pub churn_rounds: u32,
    /// Frames of the host-and-guests node (whole GiBs).
    pub guest_frames: u64,
    /// Days of host and guests.
    pub guest_days: u32,
    /// `hot_add` calls per run.
    pub hotadd_calls: usize,
    /// When a `hot_add` call counts as timed out.
    pub hotadd_timeout: Duration,
    /// Frames of the torn-down guest.
    pub teardown_frames: u64,
    /// Frames of the reporting-speed node, and of its resident (written) variant.
    pub report_frames: (u64, u64),
    /// Frames of the range taken offline, and the runs of each case.
    pub offline_frames: (u64, usize),
}

impl Sizes {
    /// The full run: 16 GiB nodes.
    pub const FULL: Sizes = Sizes {
        churn_frames: 1 << 22,
        churn_rounds: 100,
        guest_frames: 1 << 22,
        guest_days: 200,
        hotadd_calls: 20,
        hotadd_timeout: Duration::from_millis(500),
        teardown_frames: 1 << 22,
        report_frames: (1 << 22, 1 << 20),
        offline_frames: (1 << 22, 3),
    };
    /// `--quick`: 1 GiB of churn, 8 GiB of guests.
    pub const QUICK: Sizes = Sizes {
        churn_frames: 1 << 18,
        churn_rounds: 100,
        guest_frames: 1 << 21,
        guest_days: 50,
        hotadd_calls: 5,
        hotadd_timeout: Duration::from_millis(100),
        teardown_frames: 1 << 18,
        report_frames: (1 << 18, 1 << 18),
        offline_frames: (1 << 18, 3),
    };
}

/// Where the experiments report: `progress` before each run, `done` after each scenario.
pub struct Sink<'s> {
    /// The report the results go into.
    pub report: &'s mut Report,
    /// Told what starts next.
    pub progress: &'s mut dyn FnMut(&str) -> io::Result<()>,
    /// Told each time a scenario is complete.
    pub done: &'s mut dyn FnMut(&Report, &str) -> io::Result<()>,
}

impl std::fmt::Debug for Sink<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink").finish_non_exhaustive()
    }
}

/// Runs every experiment at `sizes`.
///
/// # Errors
/// If a machine cannot be built, an allocator misbehaves (a frame handed out twice, a fill
/// that does not take all memory) or a callback fails.
pub fn run(sizes: Sizes, sink: &mut Sink<'_>) -> io::Result<()> {
    hot_add(sizes, sink)?;
    churn_all(sizes, sink)?;
    guests_all(sizes, sink)?;
    teardown(sizes, sink)?;
    report_speed(sizes, sink)?;
    report_hot(sizes, sink)?;
    offline_speed(sizes, sink)
}

fn offline_speed(sizes: Sizes, sink: &mut Sink<'_>) -> io::Result<()> {
    let s = scenario::OFFLINE;
    (sink.progress)(s)?;
    let (frames, runs) = sizes.offline_frames;
    let o = offline::run(frames, runs)?;
    let gib = o.range_bytes >> 30;
    let line = |what: &str, c: &offline::Case| {
        format!("{what}: {:.3} ms ({:.0} GiB/s)", c.ns / 1e6, c.gib_per_s)
    };
    let detail = vec![
        line(
            &format!("offline of a free {gib} GiB range as hot-added"),
            &o.fresh,
        ),
        line(
            &format!("offline of a free {gib} GiB range after 4 KiB use"),
            &o.after_use,
        ),
        line(
            &format!(
                "refused offline, 1% of the frames busy ({} pageblocks busy)",
                o.busy_pageblocks
            ),
            &o.busy,
        ),
        line(&format!("hot_add of the {gib} GiB range again"), &o.re_add),
    ];
    let extra = serde_json::to_value(o).map_err(io::Error::other)?;
    sink.report.results.push(measurement(
        s,
        name::NUMAFRAME,
        o.after_use.ns,
        extra,
        detail,
    ));
    (sink.done)(sink.report, s)
}

fn report_speed(sizes: Sizes, sink: &mut Sink<'_>) -> io::Result<()> {
    let s = scenario::REPORT_SPEED;
    (sink.progress)(s)?;
    let (frames, resident) = sizes.report_frames;
    let t = reporting::speeds(frames, resident, 5)?;
    let line = |name: &str, x: &reporting::Speed| {
        format!(
            "{name}: {:.2} GiB of a {} GiB node in {} blocks, {:.2} ms: {:.0} GiB/s ({:.2}x HyperAlloc's {:.0} GiB/s)",
            x.reported_bytes as f64 / (1u64 << 30) as f64,
            x.node_bytes >> 30,
            x.blocks,
            x.ns / 1e6,
            x.gib_per_s,
            x.vs_hyperalloc,
            reporting::HYPERALLOC_GIB_S
        )
    };
    let detail = vec![
        line("no-op callback", &t.noop),
        line("madvise, untouched memory", &t.madvise_untouched),
        line("madvise, memory the guests wrote", &t.madvise_resident),
    ];
    let extra = serde_json::to_value(t).map_err(io::Error::other)?;
    let ns = 1e9 / t.noop.gib_per_s.max(1e-9);
    sink.report
        .results
        .push(measurement(s, name::NUMAFRAME, ns, extra, detail));
    (sink.done)(sink.report, s)
}

fn report_hot(sizes: Sizes, sink: &mut Sink<'_>) -> io::Result<()> {
    let s = scenario::REPORT_HOT;
    (sink.progress)(s)?;
    let quick = sizes.report_frames.0 < 1 << 20;
    let (samples, each) = if quick {
        (3, Duration::from_millis(5))
    } else {
        (15, Duration::from_millis(30))
    };
    let h = reporting::hot_paths(super::FRAMES_1G, samples, each)?;
    let line = |name: &str, x: &reporting::OnOff| {
        format!(
            "{name}: off {:.1} ns, on {:.1} ns, on/off {:.3}",
            x.off_ns, x.on_ns, x.ratio
        )
    };
    let detail = vec![
        line("pair (ns per pair)", &h.pair),
        line("bulk-512 alloc+free (ns per frame)", &h.bulk),
        format!("{} reports ran during the \"on\" samples", h.reports),
    ];
    let extra = serde_json::to_value(h).map_err(io::Error::other)?;
    sink.report
        .results
        .push(measurement(s, name::NUMAFRAME, h.pair.on_ns, extra, detail));
    (sink.done)(sink.report, s)
}

fn teardown(sizes: Sizes, sink: &mut Sink<'_>) -> io::Result<()> {
    let s = scenario::TEARDOWN;
    (sink.progress)(s)?;
    let t = teardown::run(sizes.teardown_frames)?;
    let ms = |ns: u128| ns as f64 / 1e6;
    let way = |name: &str, w: &teardown::WayTimes| {
        format!(
            "{name}: teardown {:.1} ms, scrub {:.1} ms, reallocation {:.1} ms, total {:.1} ms",
            ms(w.teardown_ns),
            ms(w.scrub_ns),
            ms(w.realloc_ns),
            ms(w.teardown_ns + w.scrub_ns + w.realloc_ns)
        )
    };
    let detail = vec![
        format!("guest of {} MiB", t.bytes >> 20),
        way("inline zeroing", &t.inline),
        way("background scrub", &t.background),
        way("no zeroing (floor)", &t.floor),
        format!(
            "memset of the same memory {:.1} ms; clearing throughput vs memset: scrub {:.0}%, inline {:.0}%",
            ms(t.memset_ns),
            100.0 * t.scrub_vs_memset,
            100.0 * t.inline_vs_memset
        ),
    ];
    let extra = serde_json::to_value(t).map_err(io::Error::other)?;
    let ns = t.background.scrub_ns as f64 / (t.bytes / PAGE_SIZE).max(1) as f64;
    sink.report
        .results
        .push(measurement(s, name::NUMAFRAME, ns, extra, detail));
    (sink.done)(sink.report, s)
}

fn err(what: &str) -> impl Fn(String) -> io::Error + '_ {
    move |e| io::Error::other(format!("{what}: {e}"))
}

fn percent(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_string(), |v| format!("{:.1}%", 100.0 * v))
}

fn measurement(
    scenario: &'static str,
    allocator: &'static str,
    ns_per_op: f64,
    extra: Value,
    detail: Vec<String>,
) -> Measurement {
    let mut m = Measurement::timed(scenario, allocator, vec![ns_per_op]);
    if let Value::Object(map) = extra {
        m.extra = map;
    } else {
        m.extra = Map::new();
    }
    m.detail = detail;
    m
}

fn hot_add(sizes: Sizes, sink: &mut Sink<'_>) -> io::Result<()> {
    for (s, load) in [(scenario::HOTADD_LOAD, 2), (scenario::HOTADD_IDLE, 0)] {
        (sink.progress)(s)?;
        let l = hotadd::run(sizes.hotadd_calls, load, sizes.hotadd_timeout)?;
        let detail = vec![format!(
            "{} calls: median {:.1} us, worst {:.1} us, {} timed out (> {} ms, load paused){}",
            l.calls,
            l.median_ns / 1e3,
            l.worst_ns / 1e3,
            l.timeouts,
            sizes.hotadd_timeout.as_millis(),
            if load > 0 {
                format!("; load {:.1} M pairs/s", l.load_pairs_per_s / 1e6)
            } else {
                String::new()
            }
        )];
        let extra = serde_json::to_value(&l).map_err(io::Error::other)?;
        sink.report
            .results
            .push(measurement(s, name::NUMAFRAME, l.median_ns, extra, detail));
        (sink.done)(sink.report, s)?;
    }
    Ok(())
}

fn churn_all(sizes: Sizes, sink: &mut Sink<'_>) -> io::Result<()> {
    let s = scenario::CHURN;
    let frames = sizes.churn_frames;
    let rounds = sizes.churn_rounds;
    let base = NODE_BASE / PAGE_SIZE;
    let record = |sink: &mut Sink<'_>, allocator, o: churn::Outcome| {
        let fmt = |f: &dyn Fn(&churn::Checkpoint) -> Option<f64>| {
            o.checkpoints
                .iter()
                .map(|c| format!("r{} {}", c.round, percent(f(c))))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut detail = vec![
            format!("HBA_9:  {}", fmt(&|c| c.hba9)),
            format!("HBA_18: {}", fmt(&|c| c.hba18)),
        ];
        detail.push(match o.order9 {
            Some(p) => format!(
                "order-9 after round {rounds}: {} allocations succeeded, {} aligned 2 MiB blocks were fully free",
                p.found, p.free_blocks
            ),
            None => "order-9: not measured (this allocator cannot allocate aligned 2 MiB blocks)"
                .to_string(),
        });
        let extra = json!({
            "frames": frames,
            "checkpoints": o.checkpoints,
            "order9": o.order9,
        });
        let ns = o.time.as_nanos() as f64 / o.ops.max(1) as f64;
        sink.report
            .results
            .push(measurement(s, allocator, ns, extra, detail));
    };
    let step = |sink: &mut Sink<'_>, allocator: &str| (sink.progress)(&format!("{s}: {allocator}"));

    step(sink, name::NUMAFRAME)?;
    {
        let node = OneNode::exact(frames)?;
        let m = node.boot()?;
        let mut a = NumaCpu::new(&m, 0);
        let o = churn::run(&mut a, base, frames, rounds, true, &mut |_| m.drain_all())
            .map_err(err("churn, numaframe"))?;
        record(sink, name::NUMAFRAME, o);
    }
    step(sink, name::NUMAFRAME_NODE)?;
    {
        let node = OneNode::exact(frames)?;
        let m = node.boot()?;
        let mut a = NumaNode::new(&m, NodeId::new(0), AllocFlags::empty());
        let o = churn::run(&mut a, base, frames, rounds, true, &mut |_| {})
            .map_err(err("churn, numaframe-node"))?;
        record(sink, name::NUMAFRAME_NODE, o);
    }
    step(sink, name::NUMAFRAME_NODE_CLEAN)?;
    {
        let node = OneNode::exact(frames)?;
        let m = node.boot()?;
        let mut a = NumaNode::new(&m, NodeId::new(0), AllocFlags::empty()).freeing_clean();
        let o = churn::run(&mut a, base, frames, rounds, true, &mut |_| {})
            .map_err(err("churn, numaframe-node-clean-free"))?;
        record(sink, name::NUMAFRAME_NODE_CLEAN, o);
    }
    step(sink, name::BUDDY)?;
    let o = churn::run(
        &mut Buddy::new(frames),
        0,
        frames,
        rounds,
        true,
        &mut |_| {},
    )
    .map_err(err("churn, buddy_system_allocator"))?;
    record(sink, name::BUDDY, o);
    step(sink, name::BITMAP)?;
    let o = if frames <= BitAlloc1M::CAP as u64 {
        bitmap_churn::<BitAlloc1M>(frames, rounds)
    } else {
        bitmap_churn::<BitAlloc16M>(frames, rounds)
    }?;
    record(sink, name::BITMAP, o);
    step(sink, name::ORACLE)?;
    let o = churn::run(
        &mut Oracle::blocks(frames),
        0,
        frames,
        rounds,
        true,
        &mut |_| {},
    )
    .map_err(err("churn, oracle"))?;
    record(sink, name::ORACLE, o);
    (sink.done)(sink.report, s)
}

/// bitmap-allocator's churn on a thread of its own with a large stack: `Box::new` of the
/// 16M-bit tree (2 MiB) may build it on the stack first.
fn bitmap_churn<B: BitAlloc + Send>(frames: u64, rounds: u32) -> io::Result<churn::Outcome> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn_scoped(s, || {
                let mut a = Bitmap::<B>::new(frames);
                churn::run(&mut a, 0, frames, rounds, true, &mut |_| {})
            })?
            .join()
            .map_err(|_| io::Error::other("the bitmap-allocator thread panicked"))?
            .map_err(err("churn, bitmap-allocator"))
    })
}

fn guests_all(sizes: Sizes, sink: &mut Sink<'_>) -> io::Result<()> {
    let s = scenario::GUESTS;
    let (frames, days) = (sizes.guest_frames, sizes.guest_days);
    let record = |sink: &mut Sink<'_>, allocator, o: guests::Outcome| {
        let cps: Vec<String> = o
            .checkpoints
            .iter()
            .map(|c| format!("day {} {}", c.day, percent(c.hba18)))
            .collect();
        let detail = vec![
            format!("HBA_18: {}", cps.join(", ")),
            format!(
                "guests created after day 0: {} ({} failed); memory backed by 1 GiB frames {:.1}% (their whole GiBs: {:.1}%), by 2 MiB {:.1}%",
                o.guests,
                o.failed,
                100.0 * o.share_1g,
                100.0 * o.share_1g_possible,
                100.0 * o.share_2m
            ),
        ];
        let extra = json!({
            "frames": frames,
            "days": days,
            "checkpoints": o.checkpoints,
            "share_1g": o.share_1g,
            "share_2m": o.share_2m,
            "share_1g_possible": o.share_1g_possible,
            "guests": o.guests,
            "failed": o.failed,
        });
        let ns = o.time.as_nanos() as f64 / o.ops.max(1) as f64;
        sink.report
            .results
            .push(measurement(s, allocator, ns, extra, detail));
    };
    (sink.progress)(&format!("{s}: {}", name::NUMAFRAME_NODE))?;
    {
        let node = OneNode::exact(frames)?;
        let m = node.boot()?;
        let mut a = NumaNode::new(&m, NodeId::new(0), AllocFlags::empty());
        let o = guests::run(&mut a, NODE_BASE / PAGE_SIZE, frames, days)
            .map_err(err("host and guests, numaframe-node"))?;
        record(sink, name::NUMAFRAME_NODE, o);
    }
    (sink.progress)(&format!("{s}: {}", name::ORACLE))?;
    let o = guests::run(&mut Oracle::sections(frames), 0, frames, days)
        .map_err(err("host and guests, oracle"))?;
    record(sink, name::ORACLE, o);
    (sink.done)(sink.report, s)
}
