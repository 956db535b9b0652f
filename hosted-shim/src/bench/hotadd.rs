//! How long `Machine::hot_add` takes from request to return while 2 threads allocate and free
//! through the per-CPU API (one `CpuId` each), against the same calls on an idle machine.
//!
//! The machine: one node of 1 GiB at 4 GiB, booted with a hotplug slot per call; the ranges
//! added lie above it (one arena of simulated memory maps them). A zone takes at most
//! `MAX_SPANS_PER_ZONE` ranges, so longer series run on several fresh machines in turn. Each load thread allocates
//! [`WINDOW`] order-0 frames through `alloc_cpu` and frees them through `free_cpu`, over and
//! over: more than a cache holds, so its refills and drains walk the zonelist under the layout
//! read lock that `hot_add` must take for writing. The main thread makes the calls one after
//! the other, a short pause between them.
//!
//! A call that has not returned after `timeout` is a timeout: the load threads then stop
//! allocating until it returns (so the run always ends), and its wait is reported as at least
//! the timeout. On a lock that lets readers starve a writer that is what happens.
#![deny(unsafe_code)]

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use numaframe::zonelist::FallbackOptions;
use numaframe::{
    AllocFlags, BootOptions, MAX_SPANS_PER_ZONE, Machine, MemoryRange, NodeId, Order, PAGE_SIZE,
    Pfn, PhysAddr, PhysRange,
};
use serde::Serialize;

use super::NODE_BASE;
use crate::sim::SimMemory;
use crate::spec::{MachineSpec, NodeSpec};

/// Frames a load thread allocates before it frees them.
pub const WINDOW: usize = 1024;
/// Bytes each call adds.
pub const CALL_BYTES: u64 = 64 << 20;
/// Where the added ranges start: past the boot node.
const ADD_BASE: u64 = NODE_BASE + (2 << 30);

/// What the calls of one run waited.
#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    /// Calls made.
    pub calls: usize,
    /// Calls that had not returned after the timeout.
    pub timeouts: usize,
    /// The timeout, ns.
    pub timeout_ns: u64,
    /// Median wait, ns (a timed-out call counts with the time it took once the load stopped).
    pub median_ns: f64,
    /// Longest wait, ns.
    pub worst_ns: f64,
    /// Order-0 alloc+free pairs per second the load threads made during the calls (0 idle).
    pub load_pairs_per_s: f64,
}

/// Runs `calls` hot-adds with `load` threads (0 or more) allocating, each call given up on
/// after `timeout`. A zone takes at most [`MAX_SPANS_PER_ZONE`] ranges, so the calls are
/// made in batches, each on a fresh machine.
///
/// # Errors
/// If the simulated memory cannot be mapped or a boot or a hot-add fails.
pub fn run(calls: usize, load: usize, timeout: Duration) -> io::Result<Latency> {
    let per_machine = MAX_SPANS_PER_ZONE - 1;
    let mut all = Batch::default();
    let mut left = calls;
    while left > 0 {
        let b = batch(left.min(per_machine), load, timeout)?;
        left -= b.waits.len();
        all.waits.extend(b.waits);
        all.timeouts += b.timeouts;
        all.pairs += b.pairs;
        all.load_time += b.load_time;
    }
    let worst = all.waits.iter().copied().fold(0.0, f64::max);
    Ok(Latency {
        calls: all.waits.len(),
        timeouts: all.timeouts,
        timeout_ns: timeout.as_nanos() as u64,
        median_ns: super::report::median(&mut all.waits),
        worst_ns: worst,
        load_pairs_per_s: if load == 0 {
            0.0
        } else {
            all.pairs as f64 / all.load_time.as_secs_f64().max(1e-9)
        },
    })
}

/// What the calls on one machine waited.
#[derive(Debug, Default)]
struct Batch {
    /// Each call's wait, ns.
    waits: Vec<f64>,
    timeouts: usize,
    /// Pairs the load made while the calls ran.
    pairs: u64,
    load_time: Duration,
}

/// `calls` hot-adds (at most [`MAX_SPANS_PER_ZONE`] - 1) on a fresh machine.
fn batch(calls: usize, load: usize, timeout: Duration) -> io::Result<Batch> {
    let boot_bytes = (1u64 << 30) + (16 << 20);
    let node = NodeSpec {
        cpus: (0..load.max(1) as u32).collect(),
        memory_bytes: boot_bytes,
        socket: Some(0),
        ..NodeSpec::default()
    };
    let spec = MachineSpec::new("bench-hot-add", vec![node], vec![10], None)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let added = calls as u64 * CALL_BYTES;
    let memory = SimMemory::new(&[(NODE_BASE, boot_bytes), (ADD_BASE, added.max(PAGE_SIZE))])?;
    let range = PhysRange::from_bytes(PhysAddr::new(NODE_BASE), boot_bytes)
        .ok_or_else(|| io::Error::other("hot-add boot range"))?;
    let cpus = vec![NodeId::new(0); load.max(1)];
    let machine = Machine::boot(
        spec.topology(),
        &memory,
        &[MemoryRange {
            node: NodeId::new(0),
            range,
        }],
        BootOptions {
            cpus: &cpus,
            min_free_kbytes: Some(0),
            lowmem_reserve_ratio: 0,
            hotplug_slots: calls + 2,
            ..BootOptions::default()
        },
    )
    .map_err(|e| io::Error::other(format!("boot: {e}")))?;

    let epoch = Instant::now();
    let stop = AtomicBool::new(false);
    // Nanoseconds since `epoch` + 1 at which the call in flight started; 0 when none is.
    let call_start = AtomicU64::new(0);
    let pairs = AtomicU64::new(0);
    let timeout_ns = timeout.as_nanos() as u64;
    let mut waits = Vec::with_capacity(calls);
    let mut timeouts = 0;
    let (m, mem) = (&machine, &memory);
    let result: io::Result<Duration> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..load)
            .map(|t| {
                let (stop, call_start, pairs) = (&stop, &call_start, &pairs);
                s.spawn(move || load_thread(m, t, epoch, timeout_ns, stop, call_start, pairs))
            })
            .collect();
        // Let the load reach its steady state before the first call.
        let warm = Instant::now();
        while load > 0
            && pairs.load(Ordering::Relaxed) < (load * WINDOW) as u64
            && warm.elapsed() < Duration::from_secs(1)
        {
            std::thread::yield_now();
        }
        let load_start = (Instant::now(), pairs.load(Ordering::Relaxed));
        let mut failure = None;
        for i in 0..calls {
            std::thread::sleep(Duration::from_millis(2));
            let range =
                PhysRange::from_bytes(PhysAddr::new(ADD_BASE + i as u64 * CALL_BYTES), CALL_BYTES)
                    .ok_or_else(|| io::Error::other("hot-add range"));
            let range = match range {
                Ok(r) => r,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            // Release: the load threads read the start only to time the call.
            call_start.store(epoch.elapsed().as_nanos() as u64 + 1, Ordering::Release);
            let t0 = Instant::now();
            let r = m.hot_add(mem, NodeId::new(0), range, FallbackOptions::default());
            let wait = t0.elapsed();
            call_start.store(0, Ordering::Release);
            if let Err(e) = r {
                failure = Some(io::Error::other(format!("hot_add: {e}")));
                break;
            }
            if wait.as_nanos() as u64 > timeout_ns {
                timeouts += 1;
            }
            waits.push(wait.as_nanos() as f64);
        }
        let load_time = load_start.0.elapsed();
        let load_pairs = pairs.load(Ordering::Relaxed) - load_start.1;
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join()
                .map_err(|_| io::Error::other("a load thread panicked"))??;
        }
        pairs.store(load_pairs, Ordering::Relaxed);
        failure.map_or(Ok(load_time), Err)
    });
    let load_time = result?;
    machine
        .check_invariants()
        .map_err(|e| io::Error::other(format!("after the hot-adds: {e:?}")))?;
    Ok(Batch {
        waits,
        timeouts,
        pairs: pairs.load(Ordering::Relaxed),
        load_time,
    })
}

/// One load thread: windows of allocations and frees on CPU `t` until `stop`; steps aside
/// while a hot-add has been waiting longer than the timeout.
fn load_thread(
    m: &Machine<'_>,
    t: usize,
    epoch: Instant,
    timeout_ns: u64,
    stop: &AtomicBool,
    call_start: &AtomicU64,
    pairs: &AtomicU64,
) -> io::Result<()> {
    let cpu = m
        .cpu(t)
        .ok_or_else(|| io::Error::other("a CPU registered at boot"))?;
    let mut frames: Vec<Pfn> = Vec::with_capacity(WINDOW);
    while !stop.load(Ordering::Relaxed) {
        let started = call_start.load(Ordering::Acquire);
        if started != 0 && epoch.elapsed().as_nanos() as u64 > started + timeout_ns {
            while call_start.load(Ordering::Acquire) == started && !stop.load(Ordering::Relaxed) {
                std::thread::yield_now();
            }
            continue;
        }
        frames
            .extend((0..WINDOW).map_while(|_| m.alloc_cpu(cpu, Order::ZERO, AllocFlags::empty())));
        for &p in &frames {
            m.free_cpu(cpu, p, Order::ZERO)
                .map_err(|e| io::Error::other(format!("free_cpu: {e}")))?;
        }
        pairs.fetch_add(frames.len() as u64, Ordering::Relaxed);
        frames.clear();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_is_made_and_counted() {
        // More calls than one zone takes ranges: two machines.
        let idle = run(MAX_SPANS_PER_ZONE + 1, 0, Duration::from_secs(5)).unwrap();
        assert_eq!(
            (idle.calls, idle.load_pairs_per_s),
            (MAX_SPANS_PER_ZONE + 1, 0.0)
        );
        let loaded = run(2, 2, Duration::from_millis(200)).unwrap();
        assert_eq!(loaded.calls, 2);
        assert!(loaded.timeouts <= 2 && loaded.load_pairs_per_s > 0.0);
        assert!(loaded.worst_ns >= loaded.median_ns);
    }
}
