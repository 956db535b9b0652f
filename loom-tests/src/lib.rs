//! Shared fixtures for the loom models in `tests/`. Build with `RUSTFLAGS="--cfg numaframe_loom"`
//! (the test command does): the core then takes its locks and atomics from loom, and each model
//! explores every interleaving of the real code, up to `LOOM_MAX_PREEMPTIONS`.
#![cfg(numaframe_loom)]

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::sync::Mutex;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread::JoinHandle;

use numaframe::{
    AllocFlags, BootOptions, Machine, MemoryRange, NodeId, NodeInfo, Order, PcpConfig, Pfn,
    PhysMemory, PhysRange, Topology, ZoneKind,
};

/// The stack of every model thread. loom's default (32 KiB) is too small for the core, whose
/// boot builds nodes (about 10 KiB each) and per-CPU caches by value. Every model runs in
/// 128 KiB; this leaves room for more.
pub const STACK_BYTES: usize = 512 << 10;

/// Runs `f` as a loom model with loom's settings, which the `LOOM_*` environment variables
/// change. loom runs a model's body on a small stack that cannot be made larger, so the body
/// runs on a thread of its own with a [`STACK_BYTES`] stack, which the model's main thread
/// joins.
pub fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    loom::model(on_a_big_stack(f));
}

/// Runs `f` as [`model`] does, with at most `preemptions` preemptions (fewer if
/// `LOOM_MAX_PREEMPTIONS` says so), for the models that cannot explore more in reasonable
/// time; each says what it costs.
pub fn model_up_to<F>(preemptions: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(
        builder
            .preemption_bound
            .map_or(preemptions, |b| b.min(preemptions)),
    );
    builder.check(on_a_big_stack(f));
}

fn on_a_big_stack<F>(f: F) -> impl Fn() + Sync + Send + 'static
where
    F: Fn() + Sync + Send + 'static,
{
    let f = std::sync::Arc::new(f);
    move || {
        // Whatever a failed model left behind on this test thread stays leaked: it is not
        // this execution's to drop.
        KEPT.with_borrow_mut(Vec::clear);
        UNJOINED.set(0);
        let f = f.clone();
        if let Err(panic) = spawn(move || f()).join() {
            std::panic::resume_unwind(panic);
        }
        release();
    }
}

/// A model thread, to be joined before its model returns (see [`keep`]).
#[derive(Debug)]
pub struct Thread<T>(JoinHandle<T>);

impl<T> Thread<T> {
    /// Waits for the thread to finish and returns what it returned.
    ///
    /// # Errors
    /// The thread's panic.
    pub fn join(self) -> std::thread::Result<T> {
        let r = self.0.join();
        UNJOINED.set(UNJOINED.get() - 1);
        r
    }
}

/// Spawns a loom thread with a [`STACK_BYTES`] stack.
pub fn spawn<F, T>(f: F) -> Thread<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    UNJOINED.set(UNJOINED.get() + 1);
    // loom 0.7 documents the size in bytes but hands it to its coroutine crate, which counts
    // words.
    Thread(
        loom::thread::Builder::new()
            .stack_size(STACK_BYTES / size_of::<usize>())
            .spawn(f)
            .expect("loom spawns without failing"),
    )
}

/// A value [`keep`] holds, with the function that drops it.
struct Kept {
    ptr: *mut (),
    drop: unsafe fn(*mut ()),
}

/// Drops the `Box<T>` that `ptr` came from.
///
/// # Safety
/// `ptr` must come from `Box::<T>::into_raw`, and nothing may use it afterwards.
unsafe fn drop_box<T>(ptr: *mut ()) {
    // SAFETY: the caller's guarantee.
    drop(unsafe { Box::from_raw(ptr.cast::<T>()) });
}

thread_local! {
    /// What [`keep`] holds for the running execution, oldest first. loom runs every thread of
    /// a model as a coroutine of the one test thread, so this and the count below belong to
    /// the model that runs on it.
    static KEPT: RefCell<Vec<Kept>> = const { RefCell::new(Vec::new()) };
    /// Threads spawned in the running execution and not joined yet.
    static UNJOINED: Cell<usize> = const { Cell::new(0) };
}

/// Keeps `v` until the running execution of the model ends, and lends it for as long. loom
/// threads need `'static` data; leaking a machine's tables and memory instead would cost every
/// execution a hundred KiB or more, and a model runs tens of thousands.
///
/// The reference must not outlive the execution: a model joins every thread it spawns (the
/// execution checks that it did before it drops anything) and stores the reference nowhere
/// that outlives the execution.
pub fn keep<T: 'static>(v: T) -> &'static T {
    let ptr = Box::into_raw(Box::new(v));
    KEPT.with_borrow_mut(|k| {
        k.push(Kept {
            ptr: ptr.cast(),
            drop: drop_box::<T>,
        })
    });
    // SAFETY: the box stays allocated until `release` drops it, once every thread that could
    // hold the reference has been joined (the caller's promise above).
    unsafe { &*ptr }
}

/// Drops what the execution kept, newest first (a machine before the memory it borrows).
fn release() {
    assert_eq!(
        UNJOINED.get(),
        0,
        "a model left a thread unjoined: what it kept stays leaked"
    );
    while let Some(k) = KEPT.with_borrow_mut(Vec::pop) {
        // SAFETY: `keep` made `ptr` with `Box::<T>::into_raw` for this `drop`, and every thread
        // of the execution has been joined, so no reference to it is left.
        unsafe { (k.drop)(k.ptr) };
    }
}

/// A counter that every thread bumps before each call it races. Loom tries another order of two
/// threads only where it sees them touch one object, and it misses some of the conflicts inside
/// these calls (the frame tags are plain atomics to it, and a thread's own read of an atomic
/// hides another thread's earlier read from its bookkeeping); the shared counter makes it try
/// every order of the calls themselves.
#[derive(Debug, Default)]
pub struct Steps(AtomicUsize);

impl Steps {
    /// Marks the start of the next racing call.
    pub fn next(&self) {
        // Relaxed: the counter orders nothing; only its conflicts matter to loom.
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs `theirs` on a new thread and `mine` on this one, each right after bumping a [`Steps`]
/// counter they share, and returns what `mine` and `theirs` returned, once the thread is
/// joined.
pub fn race<M, T>(theirs: impl FnOnce() -> T + Send + 'static, mine: impl FnOnce() -> M) -> (M, T)
where
    T: Send + 'static,
{
    let steps = loom::sync::Arc::new(Steps::default());
    let other = {
        let steps = steps.clone();
        spawn(move || {
            steps.next();
            theirs()
        })
    };
    steps.next();
    let mine = mine();
    (mine, other.join().expect("thread"))
}

/// Physical memory that exists only where the allocator maps it: each mapped range gets its
/// own page-aligned buffer (the promise of `PhysMemory`), filled with garbage.
#[derive(Debug, Default)]
pub struct SparseMem {
    regions: Mutex<Vec<(PhysRange, Page)>>,
}

/// A page-aligned heap buffer, freed on drop.
#[derive(Debug)]
struct Page {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: allocated in `SparseMem::map` with exactly this layout, freed once here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

// SAFETY: the buffer is owned by its `Page`; the pointer is only a handle to it.
unsafe impl Send for Page {}

// SAFETY: each mapped range gets its own 4 KiB-aligned buffer that lives as long as `self` (an
// unmapped one too: dropping its `Page` frees it), requests overlapping a mapped range are
// refused, and nothing else touches the buffers.
unsafe impl PhysMemory for SparseMem {
    fn map(&self, range: PhysRange) -> Option<NonNull<u8>> {
        let mut regions = self.regions.lock().ok()?;
        if range.is_empty() || regions.iter().any(|(r, _)| r.overlaps(&range)) {
            return None;
        }
        let bytes = usize::try_from(range.bytes()).ok()?;
        let layout = std::alloc::Layout::from_size_align(bytes, 4096).ok()?;
        // SAFETY: the layout has a non-zero size (the range is not empty).
        let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) })?;
        // SAFETY: the buffer was just allocated with `bytes` bytes.
        unsafe { ptr.as_ptr().write_bytes(0x5a, bytes) };
        regions.push((range, Page { ptr, layout }));
        Some(ptr)
    }

    fn unmap(&self, range: PhysRange, _: NonNull<u8>) {
        if let Ok(mut regions) = self.regions.lock() {
            regions.retain(|(r, _)| *r != range);
        }
    }
}

/// The tables of a small machine: `nodes` nodes of `frames` frames each, back to back,
/// distance 10/20, all with CPUs. `memoryless` nodes get no memory.
#[derive(Debug)]
pub struct Tiny {
    /// Row-major distances.
    pub distances: Vec<u8>,
    /// Node states.
    pub infos: Vec<NodeInfo>,
    /// Memory ranges.
    pub ranges: Vec<MemoryRange>,
}

impl Tiny {
    /// The tables.
    pub fn new(nodes: usize, frames: u64, memoryless: &[usize]) -> Tiny {
        let distances = (0..nodes * nodes)
            .map(|i| if i / nodes == i % nodes { 10 } else { 20 })
            .collect();
        let infos = (0..nodes)
            .map(|i| NodeInfo {
                has_cpus: true,
                has_memory: !memoryless.contains(&i),
                ..NodeInfo::default()
            })
            .collect();
        let ranges = (0..nodes as u64)
            .filter(|i| !memoryless.contains(&(*i as usize)))
            .map(|i| MemoryRange {
                node: NodeId::new(i as usize),
                range: PhysRange::new(Pfn::new(i * frames), Pfn::new((i + 1) * frames))
                    .expect("ordered"),
            })
            .collect();
        Tiny {
            distances,
            infos,
            ranges,
        }
    }

    /// The tables of one node whose memory is `range`.
    pub fn one_node(range: PhysRange) -> Tiny {
        Tiny {
            ranges: vec![MemoryRange {
                node: NodeId::new(0),
                range,
            }],
            ..Tiny::new(1, 0, &[])
        }
    }

    /// Boots it with the min watermark at 0 (`min_free_kbytes` 0).
    pub fn boot<'a>(&'a self, mem: &'a SparseMem) -> Machine<'a> {
        self.boot_with_cpus(mem, &[], PcpConfig::default())
    }

    /// [`Tiny::boot`] over a fresh [`SparseMem`], both held by [`keep`] for the running
    /// execution: the machine of a model that needs nothing else of its tables or memory.
    pub fn boot_kept(self) -> Machine<'static> {
        keep(self).boot(keep(SparseMem::default()))
    }

    /// [`Tiny::boot_with_cpus`] as [`Tiny::boot_kept`] does.
    pub fn boot_kept_with_cpus(self, cpus: &[NodeId], pcp: PcpConfig) -> Machine<'static> {
        keep(self).boot_with_cpus(keep(SparseMem::default()), cpus, pcp)
    }

    /// Boots it with the min watermark at 0 and CPUs on the given nodes.
    pub fn boot_with_cpus<'a>(
        &'a self,
        mem: &'a SparseMem,
        cpus: &[NodeId],
        pcp: PcpConfig,
    ) -> Machine<'a> {
        let topo = Topology::new(&self.distances, &self.infos).expect("valid topology");
        let opts = BootOptions {
            min_free_kbytes: Some(0),
            hotplug_slots: 2,
            cpus,
            pcp,
            ..BootOptions::default()
        };
        Machine::boot(topo, mem, &self.ranges, opts).expect("boot")
    }
}

/// Gives every cached frame back and checks the invariants, and that every frame of every node
/// is free: how a model that freed all it allocated ends.
pub fn assert_all_free(m: &Machine<'_>) {
    m.drain_all();
    m.check_invariants().expect("invariants");
    assert_eq!(m.cached_pages(), 0, "drained caches hold nothing");
    for node in m.nodes() {
        assert_eq!(
            node.free_pages(),
            node.managed_pages(),
            "{:?}: every frame is back",
            node.id()
        );
    }
}

/// Allocates every free block of `node`'s `Dma32` zone (by its buddyinfo, so no allocation
/// fails and none drains a cache), then frees or takes back frames until exactly `k` are free.
/// Returns the blocks held.
pub fn leave_free(m: &Machine<'_>, node: NodeId, k: u64) -> Vec<(Pfn, Order)> {
    let mut held = Vec::new();
    let zone = m
        .node(node)
        .expect("a node of the machine")
        .zone(ZoneKind::Dma32);
    for (order, &count) in zone.buddyinfo().iter().enumerate().rev() {
        let order = Order::new(order as u8);
        for _ in 0..count {
            held.push((
                m.alloc(node, order, AllocFlags::THISNODE)
                    .expect("a free block"),
                order,
            ));
        }
    }
    assert_eq!(zone.counters().free, 0);
    held.sort_by_key(|&(_, order)| order);
    while zone.counters().free < k {
        let (p, order) = held.remove(0);
        m.free(p, order).expect("own block");
    }
    while zone.counters().free > k {
        held.push((
            m.alloc(node, Order::ZERO, AllocFlags::THISNODE)
                .expect("free frame"),
            Order::ZERO,
        ));
    }
    held
}
