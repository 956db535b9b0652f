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
    AllocFlags, BootError, BootOptions, Machine, NodeId, Order, Pfn, PhysMemory, PhysRange,
    ZoneKind,
};
use numaframe_hosted::sim::SimMemory;
use numaframe_testkit::{SparseMem, Spec, memory_range};

/// Far beyond any hot-add's cost: a hot-add that takes this long is stuck, not slow.
const STUCK: Duration = Duration::from_secs(20);

const NODE_FRAMES: u64 = 1 << 18;

fn n(i: usize) -> NodeId {
    NodeId::new(i)
}

fn range(start: u64, frames: u64) -> PhysRange {
    PhysRange::new(Pfn::new(start), Pfn::new(start + frames)).unwrap()
}

/// Two nodes of 1 GiB with CPUs 0-3 on nodes 0, 1, 0, 1, leaked for the threads.
fn spec() -> &'static Spec {
    Box::leak(Box::new(
        Spec::uniform(2, NODE_FRAMES, 0).with_cpus(&[0, 1, 0, 1]),
    ))
}

/// Boots `spec` with watermarks off and room for many hot-adds.
fn boot<M: PhysMemory>(spec: &'static Spec, mem: &'static M) -> Machine<'static> {
    spec.boot_with(
        mem,
        BootOptions {
            hotplug_slots: 64,
            ..spec.options()
        },
    )
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

    fn unmap(&self, range: PhysRange, ptr: std::ptr::NonNull<u8>) {
        self.mem.unmap(range, ptr);
    }
}

#[test]
fn hot_add_through_a_platform_that_allocates_in_map() {
    let spec = spec();
    let mem: &'static AllocatingMap = Box::leak(Box::new(AllocatingMap {
        mem: SimMemory::new(&[(0, 16 << 30)]).unwrap(),
        machine: OnceLock::new(),
    }));
    let m: &'static Machine<'static> = Box::leak(Box::new(boot(spec, mem)));
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
    let spec = spec();
    let mem: &'static SimMemory = Box::leak(Box::new(SimMemory::new(&[(0, 64 << 30)]).unwrap()));
    let m: &'static Machine<'static> = Box::leak(Box::new(boot(spec, mem)));
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

/// The largest span there is: a hot-add of 256 TiB less one frame joins, its blocks add up in
/// buddyinfo and the invariant walk, and one frame more is refused. Over sparse memory, only
/// the metadata the machine writes is ever backed.
#[test]
fn a_span_holds_up_to_one_frame_less_than_256_tib() {
    const LIMIT: u64 = 1 << 36;
    let g = 1 << 18;
    let spec = Spec::with_hot_add_target(vec![
        memory_range(0, g, 2 * g),
        memory_range(1, 2 * g, 3 * g),
    ]);
    let mem = SparseMem::new(0xa5);
    let m = spec.boot_with(&mem, spec.options());
    let start = 1 << 40;
    let opts = FallbackOptions::default();
    let before = m.node(n(2)).unwrap().free_pages();
    assert_eq!(
        m.hot_add(&mem, n(2), range(start, LIMIT), opts),
        Err(BootError::BadRange {
            start: Pfn::new(start)
        })
    );
    assert_eq!(m.node(n(2)).unwrap().free_pages(), before);
    m.hot_add(&mem, n(2), range(start, LIMIT - 1), opts)
        .unwrap();
    m.check_invariants().unwrap();
    let zone = m.node(n(2)).unwrap().zone(ZoneKind::Normal);
    let listed: u64 = zone
        .buddyinfo()
        .iter()
        .enumerate()
        .map(|(k, &blocks)| blocks << k)
        .sum();
    assert_eq!(listed, zone.counters().free);
    assert!(
        listed > LIMIT - (1 << 16),
        "the span's frames less its metadata are free"
    );
    let got = m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE).unwrap();
    m.check_invariants().unwrap();
    m.free(got, Order::ZERO).unwrap();
    m.check_invariants().unwrap();
}

/// Memory hot-added through the machine's own `PhysMemory` (the contract: it maps hot-added
/// memory too) serves every free frame: its zone's metadata pool grows into it once the new
/// span's seed is used up.
#[test]
fn hot_added_memory_serves_every_free_frame() {
    let spec =
        Spec::with_hot_add_target(vec![memory_range(0, 0, 8192), memory_range(1, 8192, 16384)]);
    let mem = SimMemory::new(&[(0, 64 << 20), (8 << 30, 4 << 30)]).unwrap();
    let m = spec.boot(&mem);
    let added = range(2 * (1 << 20), 1 << 20);
    m.hot_add(&mem, n(2), added, FallbackOptions::default())
        .unwrap();
    let zone = m.node(n(2)).unwrap().zone(ZoneKind::Normal);
    let mut held = 0u64;
    while m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE).is_some() {
        held += 1;
    }
    let c = zone.counters();
    assert_eq!(
        c.free, 0,
        "{held} frames handed out, {} free of {} managed",
        c.free, c.managed
    );
    m.check_invariants().unwrap();
}
