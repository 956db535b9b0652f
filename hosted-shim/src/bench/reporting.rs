//! Free-page reporting: how fast a node's free memory is handed to the host, and what running
//! a reporter costs the hot paths.
//!
//! Speed: a node is filled with 2 MiB blocks (a host's guests), a random half is freed, then
//! rounds free a random 10% of the held blocks and allocate as many again, so the free half is
//! scattered over blocks of 2 MiB to 1 GiB. One `Machine::report` of order 9 then hands all of
//! it over: with a no-op callback (the allocator's own cost), with the hosted
//! `madvise(MADV_DONTNEED)` over memory that was never touched (the kernel has no pages to
//! drop), and with `madvise` over memory the guests wrote (the kernel frees every page). GiB of
//! free memory reported per second; HyperAlloc (EuroSys'25) published 345 GiB/s for its
//! shared-state reclaim.
//!
//! Hot paths: the hot order-0 pair (`alloc_cpu`/`free_cpu`) and a bulk of 512 frames
//! (`alloc_bulk`/`free_bulk`) on a fresh node, with the reporter off and with one thread that
//! reports the node (hosted `madvise`) every 10 ms (Linux waits 2 s), samples alternating
//! between the two. The reporter thread exists throughout and sleeps while off, so both sides
//! share the machine alike (on 2 cores another runnable thread halves a sample's share).
#![deny(unsafe_code)]

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use numaframe::{AllocFlags, Machine, NodeId, Order, PAGE_SIZE, Pfn, PhysRange};
use serde::Serialize;

use super::{BULK, OneNode, Rng, report::median};
use crate::reporting::HostReporter;
use crate::sim::SimMemory;

/// HyperAlloc's published reclaim speed, GiB/s.
pub const HYPERALLOC_GIB_S: f64 = 345.0;

const ORDER: Order = Order::new(9);
const GIB: f64 = (1u64 << 30) as f64;

/// How the report hands memory over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Host {
    Noop,
    Untouched,
    Resident,
}

/// One way of reporting.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Speed {
    /// Bytes of the node.
    pub node_bytes: u64,
    /// Free bytes reported (half the node, after the churn).
    pub reported_bytes: u64,
    /// Blocks reported.
    pub blocks: u64,
    /// Median time of one report of all of it, over the runs.
    pub ns: f64,
    /// `reported_bytes / ns`, in GiB/s.
    pub gib_per_s: f64,
    /// The same against HyperAlloc's 345 GiB/s.
    pub vs_hyperalloc: f64,
}

/// The speed experiment's result.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Speeds {
    /// No-op callback.
    pub noop: Speed,
    /// Hosted `madvise` over untouched memory.
    pub madvise_untouched: Speed,
    /// Hosted `madvise` over memory the guests wrote (a smaller node: it becomes resident).
    pub madvise_resident: Speed,
}

/// Fills node 0 with 2 MiB blocks, frees a random half, churns `rounds` rounds of 10%; returns
/// the blocks held.
fn churn(m: &Machine<'_>, rng: &mut Rng, rounds: u32) -> Vec<Pfn> {
    let take = || m.alloc(NodeId::new(0), ORDER, AllocFlags::empty());
    let mut held: Vec<Pfn> = std::iter::from_fn(take).collect();
    let free_some = |held: &mut Vec<Pfn>, rng: &mut Rng, n: usize| {
        for _ in 0..n {
            let i = rng.below(held.len() as u64) as usize;
            let _ = m.free(held.swap_remove(i), ORDER);
        }
    };
    let half = held.len() / 2;
    free_some(&mut held, rng, half);
    for _ in 0..rounds {
        let n = held.len() / 10;
        free_some(&mut held, rng, n);
        held.extend((0..n).filter_map(|_| take()));
    }
    held
}

fn block(p: Pfn) -> PhysRange {
    PhysRange::new(p, Pfn::new(p.get() + ORDER.frames())).unwrap_or_default()
}

fn one(frames: u64, host: Host, runs: usize) -> io::Result<Speed> {
    let mut times = Vec::new();
    let (mut bytes, mut blocks) = (0, 0);
    let mut rng = Rng::new(0x5eed);
    for _ in 0..runs {
        let node = OneNode::new(frames)?;
        let m = node.boot()?;
        // Only the reporter's `madvise(MADV_DONTNEED)` zeroes what it reports.
        let m = if host == Host::Noop {
            m
        } else {
            m.with_zeroing_host()
        };
        if host == Host::Resident {
            // The guests write all of the node's memory before the churn.
            let all: Vec<Pfn> =
                std::iter::from_fn(|| m.alloc(NodeId::new(0), ORDER, AllocFlags::empty()))
                    .collect();
            for &p in &all {
                numaframe::FrameClearer::clear(node.memory(), block(p));
            }
            for p in all {
                m.free(p, ORDER).map_err(io::Error::other)?;
            }
        }
        let held = churn(&m, &mut rng, 10);
        let hosted = HostReporter::new(node.memory());
        let t = Instant::now();
        let done = match host {
            Host::Noop => m.report(NodeId::new(0), ORDER, numaframe::REPORT_CAPACITY, |_| true),
            _ => hosted.report(&m, NodeId::new(0), ORDER),
        }
        .map_err(io::Error::other)?;
        times.push(t.elapsed().as_nanos() as f64);
        if done.refused {
            return Err(io::Error::other("the kernel refused a madvise"));
        }
        bytes = done.frames * PAGE_SIZE;
        blocks = done.blocks;
        drop(held);
    }
    let ns = median(&mut times);
    let gib_per_s = bytes as f64 / GIB / (ns / 1e9);
    Ok(Speed {
        node_bytes: frames * PAGE_SIZE,
        reported_bytes: bytes,
        blocks,
        ns,
        gib_per_s,
        vs_hyperalloc: gib_per_s / HYPERALLOC_GIB_S,
    })
}

/// Measures the three ways: the no-op and untouched ones over `frames`, the resident one over
/// `resident_frames`, each the median of `runs` runs.
///
/// # Errors
/// If a machine cannot be built or the kernel refuses a `madvise`.
pub fn speeds(frames: u64, resident_frames: u64, runs: usize) -> io::Result<Speeds> {
    Ok(Speeds {
        noop: one(frames, Host::Noop, runs)?,
        madvise_untouched: one(frames, Host::Untouched, runs)?,
        madvise_resident: one(resident_frames, Host::Resident, runs)?,
    })
}

/// One hot path with reporting off and on.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct OnOff {
    /// Median ns per operation without a reporter.
    pub off_ns: f64,
    /// Median ns per operation with the reporter running.
    pub on_ns: f64,
    /// `on_ns / off_ns`.
    pub ratio: f64,
}

/// The hot-path experiment's result.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct HotPaths {
    /// Order-0 `alloc_cpu` + `free_cpu` pair, ns per pair.
    pub pair: OnOff,
    /// `alloc_bulk` + `free_bulk` of 512 frames, ns per frame.
    pub bulk: OnOff,
    /// Reports the reporter made during the "on" samples.
    pub reports: u64,
}

/// Runs `f` (which returns its operations) for about `sample`, returning ns per operation.
fn sample(sample: Duration, mut f: impl FnMut() -> u64) -> f64 {
    let t = Instant::now();
    let mut ops = 0;
    while t.elapsed() < sample {
        ops += f();
    }
    t.elapsed().as_nanos() as f64 / ops.max(1) as f64
}

/// How often the reporter reports while on (Linux waits 2 s after frees begin; this is harsh).
const EVERY: Duration = Duration::from_millis(10);

/// Runs `work` with a reporter thread that reports node 0 through `mem` every [`EVERY`] while
/// `on` is set (the caller flips it between samples); returns what `work` returned and how many
/// reports ran.
fn with_reporter<R>(
    m: &Machine<'_>,
    mem: &SimMemory,
    on: &AtomicBool,
    work: impl FnOnce() -> R,
) -> (R, u64) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let reporter = s.spawn(|| {
            let host = HostReporter::new(mem);
            let mut n = 0u64;
            // Relaxed: flags between samples; the scope's join orders everything after it.
            while !stop.load(Ordering::Relaxed) {
                if on.load(Ordering::Relaxed) {
                    let _ = host.report(m, NodeId::new(0), ORDER);
                    n += 1;
                }
                std::thread::sleep(EVERY);
            }
            n
        });
        let r = work();
        stop.store(true, Ordering::Relaxed);
        (r, reporter.join().unwrap_or(0))
    })
}

/// Measures the pair and the bulk on a node of `frames`, `samples` samples of `each` per side.
///
/// # Errors
/// If a machine cannot be built, or a frame cannot be allocated or freed.
pub fn hot_paths(frames: u64, samples: usize, each: Duration) -> io::Result<HotPaths> {
    let node = OneNode::new(frames)?;
    // The reporter's `madvise(MADV_DONTNEED)` zeroes what it reports.
    let m = node.boot()?.with_zeroing_host();
    let cpu = m.cpu(0).ok_or_else(|| io::Error::other("no CPU 0"))?;
    let pair = || {
        sample(each, || {
            for _ in 0..1000 {
                if let Some(p) = m.alloc_cpu(cpu, Order::ZERO, AllocFlags::empty()) {
                    let _ = m.free_cpu(cpu, p, Order::ZERO);
                }
            }
            1000
        })
    };
    let mut out = vec![Pfn::new(0); BULK];
    let mut bulk = || {
        sample(each, || {
            let n = m.alloc_bulk(NodeId::new(0), AllocFlags::empty(), &mut out);
            let _ = m.free_bulk(&out[..n]);
            n as u64
        })
    };
    let (mut pair_off, mut pair_on, mut bulk_off, mut bulk_on) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let on = AtomicBool::new(false);
    let ((), reports) = with_reporter(&m, node.memory(), &on, || {
        for _ in 0..samples {
            // Relaxed: see `with_reporter`.
            on.store(false, Ordering::Relaxed);
            pair_off.push(pair());
            bulk_off.push(bulk());
            on.store(true, Ordering::Relaxed);
            pair_on.push(pair());
            bulk_on.push(bulk());
        }
    });
    m.check_invariants().map_err(io::Error::other)?;
    let on_off = |off: &mut Vec<f64>, on: &mut Vec<f64>| {
        let (off_ns, on_ns) = (median(off), median(on));
        OnOff {
            off_ns,
            on_ns,
            ratio: on_ns / off_ns.max(1e-9),
        }
    };
    Ok(HotPaths {
        pair: on_off(&mut pair_off, &mut pair_on),
        bulk: on_off(&mut bulk_off, &mut bulk_on),
        reports,
    })
}
