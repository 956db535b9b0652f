//! Memory hot-add against a busy machine and against platforms that call back into it.
//!
//! These are liveness checks: a hot-add that cannot finish shows up as a timeout far beyond its
//! normal cost (microseconds), never as a measured duration.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{OnceLock, mpsc};
use std::thread;
use std::time::Duration;

use numaframe::zonelist::FallbackOptions;
use numaframe::{
    AllocFlags, BootOptions, Machine, MemoryRange, NodeId, NodeInfo, Order, Pfn, PhysMemory,
    PhysRange, Topology,
};
use numaframe_hosted::sim::SimMemory;

/// Far beyond any hot-add's cost: a hot-add that takes this long is stuck, not slow.
const STUCK: Duration = Duration::from_secs(20);

const NODE_FRAMES: u64 = 1 << 18;

fn n(i: usize) -> NodeId {
    NodeId::new(i)
}

fn range(start: u64, frames: u64) -> PhysRange {
    PhysRange::new(Pfn::new(start), Pfn::new(start + frames)).unwrap()
}

/// Two nodes of 1 GiB with CPUs, watermarks off, room for many hot-adds.
struct Tables {
    distances: Vec<u8>,
    infos: Vec<NodeInfo>,
    ranges: Vec<MemoryRange>,
    cpus: Vec<NodeId>,
}

impl Tables {
    fn new() -> &'static Tables {
        let info = NodeInfo {
            has_cpus: true,
            has_memory: true,
            ..NodeInfo::default()
        };
        Box::leak(Box::new(Tables {
            distances: vec![10, 20, 20, 10],
            infos: vec![info, info],
            ranges: (0..2)
                .map(|i| MemoryRange {
                    node: n(i),
                    range: range(i as u64 * NODE_FRAMES, NODE_FRAMES),
                })
                .collect(),
            cpus: vec![n(0), n(1), n(0), n(1)],
        }))
    }

    fn boot<M: PhysMemory>(&'static self, mem: &'static M) -> Machine<'static> {
        let topo = Topology::new(&self.distances, &self.infos).unwrap();
        let opts = BootOptions {
            cpus: &self.cpus,
            min_free_kbytes: Some(0),
            hotplug_slots: 64,
            ..BootOptions::default()
        };
        Machine::boot(topo, mem, &self.ranges, opts).unwrap()
    }
}

/// Runs `f` on a thread of its own and waits at most [`STUCK`] for it.
fn within_stuck<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(STUCK)
        .unwrap_or_else(|_| panic!("{what} did not finish within {STUCK:?}: it is stuck"))
}

/// A platform whose `map` takes a frame from the machine it serves (as a hypervisor's does when
/// it needs a page-table page for the new mapping).
struct AllocatingMap {
    mem: SimMemory,
    machine: OnceLock<&'static Machine<'static>>,
}

// SAFETY: forwards every mapping to SimMemory, which keeps the promises; the frames it takes
// from the machine are freed again and never mapped.
unsafe impl PhysMemory for AllocatingMap {
    fn map(&self, range: PhysRange) -> Option<std::ptr::NonNull<u8>> {
        if let Some(m) = self.machine.get() {
            let table = m.alloc(n(0), Order::ZERO, AllocFlags::empty())?;
            m.free(table, Order::ZERO).ok()?;
        }
        self.mem.map(range)
    }
}

#[test]
fn hot_add_through_a_platform_that_allocates_in_map() {
    let tables = Tables::new();
    let mem: &'static AllocatingMap = Box::leak(Box::new(AllocatingMap {
        mem: SimMemory::new(&[(0, 16 << 30)]).unwrap(),
        machine: OnceLock::new(),
    }));
    let m: &'static Machine<'static> = Box::leak(Box::new(tables.boot(mem)));
    mem.machine.set(m).ok().unwrap();
    within_stuck("hot_add whose map allocates", move || {
        m.hot_add(
            mem,
            n(1),
            range(4 * NODE_FRAMES, NODE_FRAMES),
            FallbackOptions::default(),
        )
        .unwrap()
    });
    m.check_invariants().unwrap();
}

#[test]
fn hot_add_finishes_while_threads_allocate() {
    let tables = Tables::new();
    let mem: &'static SimMemory = Box::leak(Box::new(SimMemory::new(&[(0, 64 << 30)]).unwrap()));
    let m: &'static Machine<'static> = Box::leak(Box::new(tables.boot(mem)));
    let stop: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    // More allocating threads than the machine has cores, through both APIs.
    let workers: Vec<_> = (0..4)
        .map(|i| {
            thread::spawn(move || {
                let cpu = m.cpu(i).unwrap();
                let mut bulk = vec![Pfn::new(0); 256];
                while !stop.load(Ordering::Relaxed) {
                    match i % 3 {
                        0 => {
                            let p = m.alloc(n(i % 2), Order::ZERO, AllocFlags::empty()).unwrap();
                            m.free(p, Order::ZERO).unwrap();
                        }
                        1 => {
                            let p = m.alloc_cpu(cpu, Order::ZERO, AllocFlags::empty()).unwrap();
                            m.free_cpu(cpu, p, Order::ZERO).unwrap();
                        }
                        _ => {
                            let got = m.alloc_bulk(n(i % 2), AllocFlags::empty(), &mut bulk);
                            m.free_bulk(&bulk[..got]).unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for k in 0..16u64 {
        within_stuck("hot_add under allocation load", move || {
            m.hot_add(
                mem,
                n((k % 2) as usize),
                range((4 + 2 * k) * NODE_FRAMES, NODE_FRAMES),
                FallbackOptions::default(),
            )
            .unwrap()
        });
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    m.drain_all();
    m.check_invariants().unwrap();
}
