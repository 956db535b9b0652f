//! Per-node heaps: a `linked_list_allocator` heap for each node that grows by frames from its own
//! node, and [`NumaHeap`], which puts one per node behind a lock and serves as a
//! `#[global_allocator]`.
//!
//! A [`NodeHeap`] takes blocks of frames from its node with [`AllocFlags::THISNODE`], so every
//! byte it hands out lives on that node. Each block becomes a *chunk*: a `linked_list_allocator`
//! [`Heap`] over the block. A block that comes right after an existing chunk (the same order,
//! the next frames, mapped right after it) extends that chunk with [`Heap::extend`] instead of
//! starting a new one, so a heap that grows into free memory stays one contiguous region. A
//! chunk whose last allocation is freed goes back to the machine, unless it is the heap's only
//! one.
//!
//! The core never maps the frames it hands out ([`PhysMemory`](crate::PhysMemory) only reaches
//! the allocator's own tables). The heap writes into its frames (the free list lives in them), so
//! the platform maps them through a [`FrameMap`]: a unikernel that identity-maps physical memory
//! uses [`IdentityMap`], a hypervisor its direct map.
//!
//! [`NumaHeap`] serves an allocation from the heap of the current CPU's node (a platform
//! callback says which node that is). When that heap cannot grow, because its node is out of
//! memory or has none, the allocation goes to the heaps of the nodes in the node's fallback order,
//! nearest first, as Linux's `kmalloc` falls back from a memoryless node to its nearest node with
//! memory. A free goes to the heap whose chunk holds the pointer.
//!
//! # Lock order
//! A node heap's lock, then the machine's locks (see the crate's `sync` module). The machine never
//! allocates from a heap, so no machine lock is held when a heap lock is taken; no path holds
//! two heap locks at once.

use core::alloc::{GlobalAlloc, Layout};
use core::fmt;
use core::ptr::{self, NonNull};

use linked_list_allocator::Heap;

use crate::addr::{Order, PAGE_SIZE, Pfn, PhysRange};
use crate::machine::{AllocFlags, Machine};
use crate::sync::{Mutex, RwLock};
use crate::topology::NodeId;

/// The most chunks (separately grown regions) one [`NodeHeap`] holds.
pub const MAX_CHUNKS: usize = 32;

/// The order a heap grows by unless an allocation needs more: 16 frames, 64 KiB.
pub const DEFAULT_GROW_ORDER: Order = Order::new(4);

/// How the platform reaches the frames a heap grows into.
///
/// # Safety
/// For every `range` of frames that a [`Machine`] handed out and on which `map_frames(range)`
/// returns `Some(p)`, the implementation guarantees that `p` is valid for reads and writes of
/// `range.bytes()` bytes, is aligned to [`PAGE_SIZE`], and stays so for as long as `self` is
/// borrowed; that those bytes are the memory of `range`'s frames alone, which nothing else
/// reaches while the machine has them handed out (mappings of disjoint ranges never overlap,
/// and none overlaps memory a [`PhysMemory`](crate::PhysMemory) maps for the machine); and
/// that mapping the frames that follow `range` gives the address right after `range`'s last
/// byte whenever the platform maps them contiguously (an identity or linear map).
pub unsafe trait FrameMap {
    /// A pointer to the first byte of `range`, or `None` if the platform cannot map it.
    fn map_frames(&self, range: PhysRange) -> Option<NonNull<u8>>;
}

/// The identity map: physical address `a` is virtual address `a` (a unikernel with the MMU off
/// or with an identity page table).
#[derive(Clone, Copy, Debug)]
pub struct IdentityMap(());

impl IdentityMap {
    /// The identity map.
    ///
    /// # Safety
    /// Physical memory must be identity-mapped, readable and writable, for as long as the
    /// value (or a copy) is used, and the frames a machine hands out must be backed by memory.
    pub const unsafe fn new() -> Self {
        Self(())
    }
}

// SAFETY: `IdentityMap::new`'s caller promised that every physical address is the virtual
// address of writable memory; frames are page aligned, and consecutive frames are consecutive
// addresses.
unsafe impl FrameMap for IdentityMap {
    fn map_frames(&self, range: PhysRange) -> Option<NonNull<u8>> {
        let addr = usize::try_from(range.start().addr().get()).ok()?;
        usize::try_from(range.end().addr().get()).ok()?;
        NonNull::new(ptr::with_exposed_provenance_mut(addr))
    }
}

/// A heap that [`NumaHeap::init`] rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum HeapError {
    /// [`NumaHeap::init`] was called before.
    AlreadyInitialised,
    /// The machine has more nodes than the heap has room for.
    TooManyNodes {
        /// Nodes of the machine.
        nodes: usize,
        /// Node heaps of the [`NumaHeap`].
        capacity: usize,
    },
}

impl fmt::Display for HeapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeapError::AlreadyInitialised => f.write_str("heap already initialised"),
            HeapError::TooManyNodes { nodes, capacity } => write!(
                f,
                "machine has {nodes} nodes, the heap has room for {capacity}"
            ),
        }
    }
}

impl core::error::Error for HeapError {}

/// One region of a heap: `blocks` buddy blocks of `order`, consecutive from `first`, mapped
/// contiguously and managed by `heap`.
///
/// Invariant: `heap` was initialised over exactly these blocks' mapping, so `heap.bottom()` is
/// the mapping of `first` and `heap.top()` is one past the last block's last byte.
struct Chunk {
    heap: Heap,
    first: Pfn,
    order: Order,
    blocks: u32,
}

impl Chunk {
    fn contains(&self, p: *mut u8) -> bool {
        let (lo, hi) = (self.heap.bottom().addr(), self.heap.top().addr());
        (lo..hi).contains(&p.addr())
    }
    fn next_pfn(&self) -> Option<Pfn> {
        self.first
            .checked_add(self.order.frames() * u64::from(self.blocks))
    }
}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chunk")
            .field("first", &self.first)
            .field("order", &self.order)
            .field("blocks", &self.blocks)
            .field("used", &self.heap.used())
            .field("size", &self.heap.size())
            .finish()
    }
}

/// What a heap holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Separately grown regions.
    pub chunks: usize,
    /// Frames taken from the machine.
    pub frames: u64,
    /// Bytes handed out (as `linked_list_allocator` counts them, rounded up).
    pub used: usize,
    /// Bytes of the heap's frames not handed out.
    pub free: usize,
}

/// The chunks of one node's heap, without the machine and map they came from: the callers
/// ([`NodeHeap`], [`NumaHeap`]) always pass the same ones.
///
/// Invariant: `chunks[..len]` are `Some`, the rest `None`; every chunk's frames were allocated
/// from `node` with [`AllocFlags::THISNODE`] from the one machine the owner holds, mapped by
/// its one map, and are still allocated.
struct Chunks {
    node: NodeId,
    chunks: [Option<Chunk>; MAX_CHUNKS],
    len: usize,
}

impl fmt::Debug for Chunks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chunks")
            .field("node", &self.node)
            .field("chunks", &&self.chunks[..self.len])
            .finish()
    }
}

/// The smallest order whose block can serve `layout` in a fresh heap, or `None` past
/// [`Order::MAX`].
fn order_for(layout: Layout) -> Option<Order> {
    // linked_list_allocator rounds sizes up to 16 bytes; a fresh heap starts page aligned, so
    // only an alignment above a page can waste space in front of the allocation.
    let size = layout.size().max(16).checked_next_multiple_of(16)?;
    let slack = if layout.align() as u64 > PAGE_SIZE {
        layout.align()
    } else {
        0
    };
    let bytes = size.checked_add(slack)? as u64;
    let frames = bytes.div_ceil(PAGE_SIZE).max(1);
    let k = frames.next_power_of_two().trailing_zeros();
    Order::try_new(u8::try_from(k).ok()?)
}

/// `layout` as the chunks hand it to `linked_list_allocator`: its size rounded up to 16 bytes.
/// The crate rounds sizes to 8 and refuses a hole that would keep a tail of 8 bytes, so without
/// this a size 8 bytes short of a block could never be placed in the block grown for it; with
/// it every hole stays a multiple of 16 bytes, as [`order_for`] counts.
fn heap_layout(layout: Layout) -> Option<Layout> {
    let size = layout.size().checked_next_multiple_of(16)?;
    Layout::from_size_align(size, layout.align()).ok()
}

impl Chunks {
    const fn new(node: NodeId) -> Self {
        Self {
            node,
            chunks: [const { None }; MAX_CHUNKS],
            len: 0,
        }
    }

    fn live(&mut self) -> impl Iterator<Item = &mut Chunk> {
        self.chunks[..self.len].iter_mut().rev().flatten()
    }

    /// Allocates `layout`, growing by at least a block of `grow` if no chunk has room.
    fn alloc(
        &mut self,
        machine: &Machine<'_>,
        map: &(impl FrameMap + ?Sized),
        layout: Layout,
        grow: Order,
    ) -> Option<NonNull<u8>> {
        let layout = heap_layout(layout)?;
        if let Some(p) = self
            .live()
            .find_map(|c| c.heap.allocate_first_fit(layout).ok())
        {
            return Some(p);
        }
        let chunk = self.grow(machine, map, order_for(layout)?.max(grow))?;
        self.chunks[chunk]
            .as_mut()?
            .heap
            .allocate_first_fit(layout)
            .ok()
    }

    /// Takes a block of `order` from the node and adds it to the heap; returns the index of the
    /// chunk that holds it.
    fn grow(
        &mut self,
        machine: &Machine<'_>,
        map: &(impl FrameMap + ?Sized),
        order: Order,
    ) -> Option<usize> {
        let bytes = usize::try_from(order.bytes()).ok()?;
        let pfn = machine.alloc(self.node, order, AllocFlags::THISNODE)?;
        let give_back = |_| {
            let freed = machine.free(pfn, order);
            debug_assert!(freed.is_ok(), "a block just allocated frees");
            None
        };
        let Some(range) = pfn
            .checked_add(order.frames())
            .and_then(|end| PhysRange::new(pfn, end))
        else {
            return give_back(());
        };
        let Some(p) = map.map_frames(range) else {
            return give_back(());
        };
        let at = self.chunks[..self.len].iter().position(|c| {
            c.as_ref().is_some_and(|c| {
                c.order == order && c.next_pfn() == Some(pfn) && c.heap.top() == p.as_ptr()
            })
        });
        if let Some(i) = at
            && let Some(c) = self.chunks[i].as_mut()
        {
            // SAFETY: the block's `bytes` bytes are mapped right after the chunk's top
            // (`c.heap.top() == p`), writable and ours alone (FrameMap's contract; the machine
            // handed the block to this heap, and nothing else frees it, the contract of
            // `NodeHeap::new` and `NumaHeap::init`), and stay so while the map is borrowed,
            // which the owner ([`NodeHeap`], [`NumaHeap`]) does for longer than it exists.
            unsafe { c.heap.extend(bytes) };
            c.blocks += 1;
            return Some(i);
        }
        if self.len == MAX_CHUNKS {
            return give_back(());
        }
        let mut heap = Heap::empty();
        // SAFETY: `p` is valid for writes of `bytes` bytes, page aligned, not used by anything
        // else (FrameMap's contract; the machine handed the block to this heap alone, and
        // nothing else frees it: the contract of `NodeHeap::new` and `NumaHeap::init`), and
        // stays valid as long as the chunk exists: the owner borrows the map for longer, and
        // the block is freed only when the chunk is dropped.
        unsafe { heap.init(p.as_ptr(), bytes) };
        self.chunks[self.len] = Some(Chunk {
            heap,
            first: pfn,
            order,
            blocks: 1,
        });
        self.len += 1;
        Some(self.len - 1)
    }

    fn owns(&self, p: *mut u8) -> bool {
        self.chunks[..self.len]
            .iter()
            .flatten()
            .any(|c| c.contains(p))
    }

    /// Frees an allocation; `false` (and nothing done) if `p` is not in a chunk. A chunk left
    /// empty goes back to the machine, unless it is the only one.
    ///
    /// # Safety
    /// `p` must have been returned by [`Chunks::alloc`] of these chunks with the same `layout`,
    /// and not freed since.
    unsafe fn dealloc(&mut self, machine: &Machine<'_>, p: NonNull<u8>, layout: Layout) -> bool {
        let Some(i) = self.chunks[..self.len]
            .iter()
            .position(|c| c.as_ref().is_some_and(|c| c.contains(p.as_ptr())))
        else {
            return false;
        };
        let Some(c) = self.chunks[i].as_mut() else {
            return false;
        };
        // `alloc` succeeded with this layout, so it exists.
        let layout = heap_layout(layout).unwrap_or(layout);
        // SAFETY: the caller promised `p` came from these chunks with `layout` and is live; the
        // chunk that contains it is the one that handed it out (chunks do not overlap).
        unsafe { c.heap.deallocate(p, layout) };
        if c.heap.used() == 0 && self.len > 1 {
            self.release(machine, i);
        }
        true
    }

    /// Gives chunk `i` (empty) back to the machine.
    fn release(&mut self, machine: &Machine<'_>, i: usize) {
        let Some(c) = self.chunks[i].take() else {
            return;
        };
        self.chunks[i..self.len].rotate_left(1);
        self.len -= 1;
        for b in 0..u64::from(c.blocks) {
            let pfn = Pfn::new(c.first.get() + b * c.order.frames());
            let freed = machine.free(pfn, c.order);
            debug_assert!(freed.is_ok(), "heap blocks are allocated: {freed:?}");
        }
    }

    fn stats(&self) -> HeapStats {
        self.chunks[..self.len]
            .iter()
            .flatten()
            .fold(HeapStats::default(), |s, c| HeapStats {
                chunks: s.chunks + 1,
                frames: s.frames + c.order.frames() * u64::from(c.blocks),
                used: s.used + c.heap.used(),
                free: s.free + c.heap.free(),
            })
    }
}

/// One node's heap: chunks of frames taken from that node of `machine`, mapped by `map`.
///
/// Not locked itself: [`NumaHeap`] keeps one per node behind a lock and is what a
/// `#[global_allocator]` uses; a single-threaded user may hold a `NodeHeap` directly. Dropping
/// it gives back the chunks that hold no allocation (the others stay allocated: their memory
/// may still be in use).
pub struct NodeHeap<'m, 'a> {
    machine: &'m Machine<'a>,
    map: &'m dyn FrameMap,
    chunks: Chunks,
}

impl fmt::Debug for NodeHeap<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeHeap")
            .field("chunks", &self.chunks)
            .finish_non_exhaustive()
    }
}

impl<'m, 'a> NodeHeap<'m, 'a> {
    /// An empty heap over `node` of `machine`: it takes no memory until the first allocation.
    ///
    /// # Safety
    /// While the heap lives, nothing else frees a block the heap took from `machine` (through
    /// [`Machine::free`] or any other call): the machine cannot tell the heap's blocks from
    /// anyone's, so it would accept such a free and hand the memory out again, to this heap too,
    /// while its allocations live there.
    pub unsafe fn new(machine: &'m Machine<'a>, map: &'m dyn FrameMap, node: NodeId) -> Self {
        Self {
            machine,
            map,
            chunks: Chunks::new(node),
        }
    }

    /// The node whose frames the heap uses.
    pub fn node(&self) -> NodeId {
        self.chunks.node
    }

    /// Allocates `layout` from the heap, growing it by at least a block of `grow` from its node
    /// if no chunk has room. `None` when the node has no memory left (or the heap holds
    /// [`MAX_CHUNKS`] chunks and none has room).
    #[must_use = "dropping the allocation leaks it"]
    pub fn alloc(&mut self, layout: Layout, grow: Order) -> Option<NonNull<u8>> {
        self.chunks.alloc(self.machine, self.map, layout, grow)
    }

    /// `true` if `p` points into one of the heap's chunks.
    pub fn owns(&self, p: *mut u8) -> bool {
        self.chunks.owns(p)
    }

    /// Frees an allocation; returns `false` (and does nothing) if `p` is not in this heap. A
    /// chunk left empty goes back to the machine, unless it is the heap's only chunk.
    ///
    /// # Safety
    /// `p` must have been returned by [`NodeHeap::alloc`] of this heap with the same `layout`,
    /// and not freed since.
    pub unsafe fn dealloc(&mut self, p: NonNull<u8>, layout: Layout) -> bool {
        // SAFETY: the caller's promise, and these chunks belong to this heap.
        unsafe { self.chunks.dealloc(self.machine, p, layout) }
    }

    /// What the heap holds.
    pub fn stats(&self) -> HeapStats {
        self.chunks.stats()
    }
}

impl Drop for NodeHeap<'_, '_> {
    fn drop(&mut self) {
        for i in (0..self.chunks.len).rev() {
            if self.chunks.chunks[i]
                .as_ref()
                .is_some_and(|c| c.heap.used() == 0)
            {
                self.chunks.release(self.machine, i);
            }
        }
    }
}

/// What [`NumaHeap::init`] fixes.
#[derive(Clone, Copy)]
struct Ctx<'m, 'a> {
    machine: &'m Machine<'a>,
    map: &'m (dyn FrameMap + Sync),
    current_node: fn() -> NodeId,
    grow: Order,
}

/// Per-node heaps for up to `N` nodes behind locks: a [`GlobalAlloc`].
///
/// A unikernel declares one as its global allocator and starts it once its machine is up:
///
/// ```no_run
/// use numaframe::heap::{DEFAULT_GROW_ORDER, IdentityMap, NumaHeap};
/// use numaframe::{Machine, NodeId};
///
/// #[global_allocator]
/// static HEAP: NumaHeap<'static, 'static, 8> = NumaHeap::new();
/// // SAFETY: this platform identity-maps physical memory (say, the MMU is off).
/// static FRAMES: IdentityMap = unsafe { IdentityMap::new() };
///
/// /// The node of the running CPU, as the platform knows it.
/// fn current_node() -> NodeId {
///     NodeId::new(0)
/// }
///
/// fn start_heap(machine: &'static Machine<'static>) {
///     // SAFETY: nothing else frees the frames the heap takes from `machine`.
///     unsafe { HEAP.init(machine, &FRAMES, current_node, DEFAULT_GROW_ORDER) }
///         .expect("called once, on a machine of at most 8 nodes");
///     // From here on `alloc` (Vec, Box, String) takes memory from the CPU's node.
/// }
/// # fn main() {}
/// ```
///
/// Before [`NumaHeap::init`] every allocation fails (returns null).
pub struct NumaHeap<'m, 'a, const N: usize> {
    ctx: RwLock<Option<Ctx<'m, 'a>>>,
    heaps: [Mutex<Chunks>; N],
}

impl<const N: usize> fmt::Debug for NumaHeap<'_, '_, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NumaHeap")
            .field("initialised", &self.ctx.read().is_some())
            .field("nodes", &N)
            .finish_non_exhaustive()
    }
}

impl<const N: usize> Default for NumaHeap<'_, '_, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'m, 'a, const N: usize> NumaHeap<'m, 'a, N> {
    /// An uninitialised heap (usable in a `static`).
    #[cfg(not(numaframe_loom))]
    pub const fn new() -> Self {
        Self {
            ctx: RwLock::new(None),
            heaps: [const { Mutex::new(Chunks::new(NodeId::new(0))) }; N],
        }
    }

    /// An uninitialised heap.
    #[cfg(numaframe_loom)]
    pub fn new() -> Self {
        Self {
            ctx: RwLock::new(None),
            heaps: core::array::from_fn(|_| Mutex::new(Chunks::new(NodeId::new(0)))),
        }
    }

    /// Starts serving allocations from `machine`'s nodes, growing by blocks of at least `grow`.
    /// `current_node` says which node the calling CPU is on.
    ///
    /// # Errors
    /// [`HeapError::AlreadyInitialised`] on a second call, [`HeapError::TooManyNodes`] if the
    /// machine has more than `N` nodes.
    ///
    /// # Safety
    /// From then on, nothing else frees a block the heap took from `machine` (through
    /// [`Machine::free`] or any other call): as for [`NodeHeap::new`].
    pub unsafe fn init(
        &self,
        machine: &'m Machine<'a>,
        map: &'m (dyn FrameMap + Sync),
        current_node: fn() -> NodeId,
        grow: Order,
    ) -> Result<(), HeapError> {
        let nodes = machine.topology().len();
        if nodes > N {
            return Err(HeapError::TooManyNodes { nodes, capacity: N });
        }
        let mut ctx = self.ctx.write();
        if ctx.is_some() {
            return Err(HeapError::AlreadyInitialised);
        }
        for (i, h) in self.heaps.iter().enumerate().take(nodes) {
            *h.lock() = Chunks::new(NodeId::new(i));
        }
        *ctx = Some(Ctx {
            machine,
            map,
            current_node,
            grow,
        });
        Ok(())
    }

    /// What the heap of `node` holds (all zero for a node outside the machine).
    pub fn stats(&self, node: NodeId) -> HeapStats {
        self.heaps
            .get(node.index())
            .map_or_else(HeapStats::default, |h| h.lock().stats())
    }

    /// Allocates `layout` preferring the heap of `node`, then those of its fallback order.
    /// Null when no node can serve it or before [`NumaHeap::init`].
    pub fn alloc_on(&self, node: NodeId, layout: Layout) -> *mut u8 {
        let Some(ctx) = *self.ctx.read() else {
            return ptr::null_mut();
        };
        // A heap past the machine's nodes was never set to its node (its chunks would take
        // frames from node 0): a node outside the machine gets nothing.
        if !ctx.machine.topology().contains(node) {
            return ptr::null_mut();
        }
        let try_node = |n: NodeId| {
            let h = self.heaps.get(n.index())?;
            h.lock().alloc(ctx.machine, ctx.map, layout, ctx.grow)
        };
        if let Some(p) = try_node(node) {
            return p.as_ptr();
        }
        let mut order = [NodeId::default(); N];
        let len = ctx.machine.fallback_order(node, &mut order);
        order[..len]
            .iter()
            .filter(|n| **n != node)
            .find_map(|n| try_node(*n))
            .map_or(ptr::null_mut(), NonNull::as_ptr)
    }
}

// SAFETY:
// 1. `alloc` returns null or memory from a chunk: a block of frames allocated from the machine
//    for this heap alone and mapped writable by the FrameMap for `'m`, which outlives `self`.
//    `linked_list_allocator` hands out each byte once and honours the layout's size and
//    alignment.
// 2. `dealloc` gives a pointer back to the one heap whose chunk contains it; chunks of
//    different heaps never overlap because the machine hands out each frame once. A chunk goes
//    back to the machine only when nothing in it is allocated.
// 3. No method panics or allocates through the global allocator; locks are spinlocks taken in
//    the documented order.
unsafe impl<const N: usize> GlobalAlloc for NumaHeap<'_, '_, N> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(ctx) = *self.ctx.read() else {
            return ptr::null_mut();
        };
        self.alloc_on((ctx.current_node)(), layout)
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        let (Some(ctx), Some(p)) = (*self.ctx.read(), NonNull::new(p)) else {
            return;
        };
        let first = (ctx.current_node)().index();
        let order = self.heaps.get(first).into_iter().chain(self.heaps.iter());
        for h in order {
            let mut h = h.lock();
            if h.owns(p.as_ptr()) {
                // SAFETY: GlobalAlloc's caller promised `p` came from `alloc` with `layout`;
                // `alloc` took it from a chunk of this heap (the one that owns it).
                unsafe { h.dealloc(ctx.machine, p, layout) };
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::alloc::{alloc_zeroed, dealloc};
    use std::vec::Vec;

    use super::*;
    use crate::sync::Ordering;
    use crate::test_util::{SparseMem, Spec};

    /// Frames `base..base + frames` backed by one page-aligned host buffer.
    struct VecFrames {
        base: u64,
        frames: u64,
        ptr: *mut u8,
    }

    // SAFETY: the buffer is only reached through the pointers `map_frames` hands out.
    unsafe impl Sync for VecFrames {}

    impl VecFrames {
        fn new(base: u64, frames: u64) -> Self {
            let layout = Layout::from_size_align((frames * PAGE_SIZE) as usize, 4096).unwrap();
            // SAFETY: the layout has a non-zero size.
            let ptr = unsafe { alloc_zeroed(layout) };
            assert!(!ptr.is_null());
            Self { base, frames, ptr }
        }
    }

    impl Drop for VecFrames {
        fn drop(&mut self) {
            let layout = Layout::from_size_align((self.frames * PAGE_SIZE) as usize, 4096).unwrap();
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(self.ptr, layout) };
        }
    }

    // SAFETY: a frame inside the buffer maps to its page of the buffer, page aligned, valid as
    // long as `self`; consecutive frames are consecutive pages; each frame is handed out by the
    // machine once, so the pages are used by one heap at a time.
    unsafe impl FrameMap for VecFrames {
        fn map_frames(&self, range: PhysRange) -> Option<NonNull<u8>> {
            let start = range.start().get().checked_sub(self.base)?;
            if range.end().get() > self.base + self.frames {
                return None;
            }
            // SAFETY: `start` frames into the buffer is inside it (checked above).
            NonNull::new(unsafe { self.ptr.add((start * PAGE_SIZE) as usize) })
        }
    }

    fn node(i: usize) -> NodeId {
        NodeId::new(i)
    }

    #[test]
    fn node_heap_grows_from_its_node_extends_and_gives_back() {
        let spec = Spec::uniform(2, 2048, 0);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let frames = VecFrames::new(0, 4096);
        // SAFETY: nothing else frees the heap's blocks.
        let mut h = unsafe { NodeHeap::new(&m, &frames, node(1)) };
        let before = m.node(node(1)).unwrap().free_pages();
        let before0 = m.node(node(0)).unwrap().free_pages();
        let small = Layout::from_size_align(100, 8).unwrap();
        let mut ptrs = Vec::new();
        // Under Miri fewer (the heap's free list makes each allocation walk the earlier ones),
        // still enough to grow by several blocks.
        let count = if cfg!(miri) { 1200 } else { 6000 };
        for i in 0..count {
            let p = h.alloc(small, DEFAULT_GROW_ORDER).unwrap();
            // SAFETY: `p` holds 100 writable bytes.
            unsafe { p.as_ptr().write_bytes(i as u8, 100) };
            ptrs.push(p);
        }
        let s = h.stats();
        assert!(s.frames > 16, "{s:?}");
        assert!(
            (s.chunks as u64) * 16 * 2 <= s.frames,
            "consecutive blocks extend a chunk, got {s:?}"
        );
        assert_eq!(
            m.node(node(1)).unwrap().free_pages(),
            before - s.frames,
            "every frame comes from node 1"
        );
        assert_eq!(
            m.node(node(0)).unwrap().free_pages(),
            before0,
            "node 0 untouched"
        );
        for (i, p) in ptrs.iter().enumerate() {
            // SAFETY: each allocation was written with its index above and is still live.
            let first = unsafe { p.as_ptr().read() };
            assert_eq!(first, i as u8, "no two allocations overlap");
        }
        // A large, over-aligned allocation gets a chunk of its own.
        let big = Layout::from_size_align(300 << 10, 64 << 10).unwrap();
        let q = h.alloc(big, DEFAULT_GROW_ORDER).unwrap();
        assert_eq!(q.as_ptr().addr() % (64 << 10), 0);
        assert!(h.stats().chunks >= 2);
        // SAFETY: `q` came from `h` with `big`.
        assert!(unsafe { h.dealloc(q, big) });
        for p in ptrs {
            // SAFETY: every pointer came from `h` with `small` and is freed once.
            assert!(unsafe { h.dealloc(p, small) });
        }
        let s = h.stats();
        assert_eq!(s.chunks, 1, "empty chunks go back except the last");
        assert_eq!(s.used, 0);
        assert_eq!(m.node(node(1)).unwrap().free_pages(), before - s.frames);
        m.check_invariants().unwrap();
        let foreign = NonNull::new(frames.ptr).unwrap();
        // SAFETY: a pointer outside the heap is refused without being touched.
        assert!(!unsafe { h.dealloc(foreign, small) });
        drop(h);
        assert_eq!(
            m.node(node(1)).unwrap().free_pages(),
            before,
            "dropping an empty heap gives its last chunk back"
        );
    }

    #[test]
    fn node_heap_fails_when_its_node_is_exhausted() {
        let spec = Spec::uniform(2, 512, 0);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let frames = VecFrames::new(0, 1024);
        // SAFETY: nothing else frees the heap's blocks.
        let mut h = unsafe { NodeHeap::new(&m, &frames, node(0)) };
        let page = Layout::from_size_align(4096, 4096).unwrap();
        let mut n = 0;
        while h.alloc(page, Order::ZERO).is_some() {
            n += 1;
        }
        assert!(n > 400, "most of node 0 is usable: {n}");
        assert!(
            m.alloc(node(0), Order::ZERO, AllocFlags::THISNODE)
                .is_none()
        );
        assert!(
            m.alloc(node(1), Order::ZERO, AllocFlags::THISNODE)
                .is_some(),
            "node 1 untouched"
        );
    }

    static MACHINE_NODE: crate::sync::AtomicUsize = crate::sync::AtomicUsize::new(0);

    fn current() -> NodeId {
        NodeId::new(MACHINE_NODE.load(Ordering::Relaxed))
    }

    #[test]
    fn numa_heap_is_a_global_alloc_with_node_fallback() {
        let mut spec = Spec::uniform(3, 1024, 0);
        // Node 2 is memoryless: its nearest node with memory serves it.
        spec.infos[2].has_memory = false;
        spec.ranges.pop();
        spec.distances = std::vec![10, 20, 30, 20, 10, 15, 30, 15, 10];
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let frames = VecFrames::new(0, 2048);
        let heap: NumaHeap<'_, '_, 4> = NumaHeap::new();
        let layout = Layout::from_size_align(64, 8).unwrap();
        // SAFETY: a non-zero layout; null is checked.
        assert!(unsafe { heap.alloc(layout) }.is_null(), "not initialised");
        // SAFETY: nothing else frees the heap's blocks.
        unsafe { heap.init(&m, &frames, current, DEFAULT_GROW_ORDER) }.unwrap();
        assert_eq!(
            // SAFETY: as above.
            unsafe { heap.init(&m, &frames, current, DEFAULT_GROW_ORDER) },
            Err(HeapError::AlreadyInitialised)
        );
        let mut live = Vec::new();
        for cpu_node in [0usize, 1, 2] {
            MACHINE_NODE.store(cpu_node, Ordering::Relaxed);
            // SAFETY: a non-zero layout.
            let p = unsafe { heap.alloc(layout) };
            assert!(!p.is_null());
            let pfn = Pfn::new((p.addr() - frames.ptr.addr()) as u64 / PAGE_SIZE);
            let want = if cpu_node == 2 { 1 } else { cpu_node };
            assert_eq!(m.node_of(pfn), Some(node(want)), "CPU on node {cpu_node}");
            live.push(p);
        }
        assert_eq!(heap.stats(node(2)), HeapStats::default());
        // Free from another node's CPU: the owning heap takes it back.
        MACHINE_NODE.store(0, Ordering::Relaxed);
        for p in live {
            // SAFETY: `p` came from `heap.alloc(layout)`.
            unsafe { heap.dealloc(p, layout) };
        }
        assert_eq!(heap.stats(node(0)).used + heap.stats(node(1)).used, 0);
        // Exhaust node 0's heap: allocations move on to node 1 (its fallback).
        let big = Layout::from_size_align(256 << 10, 4096).unwrap();
        let mut on1 = 0;
        for _ in 0..20 {
            // SAFETY: a non-zero layout.
            let p = unsafe { heap.alloc(big) };
            assert!(!p.is_null());
            let pfn = Pfn::new((p.addr() - frames.ptr.addr()) as u64 / PAGE_SIZE);
            on1 += usize::from(m.node_of(pfn) == Some(node(1)));
        }
        assert!(on1 > 0, "node 0 (4 MiB) cannot hold 20 x 256 KiB");
        m.check_invariants().unwrap();
        let too_many: NumaHeap<'_, '_, 2> = NumaHeap::new();
        assert_eq!(
            // SAFETY: as above.
            unsafe { too_many.init(&m, &frames, current, DEFAULT_GROW_ORDER) },
            Err(HeapError::TooManyNodes {
                nodes: 3,
                capacity: 2
            })
        );
    }

    #[test]
    fn a_size_just_under_a_block_is_served_and_no_node_outside_the_machine() {
        let spec = Spec::uniform(2, 2048, 0);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let frames = VecFrames::new(0, 4096);
        // Room for 4 nodes on a machine of 2.
        let heap: NumaHeap<'_, '_, 4> = NumaHeap::new();
        // SAFETY: nothing else frees the heap's blocks.
        unsafe { heap.init(&m, &frames, current, DEFAULT_GROW_ORDER) }.unwrap();
        // linked_list_allocator rounds sizes to 8 bytes and refuses a hole that would keep a
        // tail of 8 bytes, while `order_for` rounds to 16: 128 KiB - 8 bytes (a
        // `Vec<u8>::with_capacity(131_064)`, order 5, above the grow order) got a chunk of
        // exactly 128 KiB it could never be placed in, on every node.
        let layout = Layout::from_size_align((128 << 10) - 8, 8).unwrap();
        let p = heap.alloc_on(node(0), layout);
        assert!(
            !p.is_null(),
            "two nodes of 8 MiB, yet a {}-byte allocation failed; node heaps {:?} {:?}",
            layout.size(),
            heap.stats(node(0)),
            heap.stats(node(1))
        );
        // SAFETY: `p` came from `heap.alloc(layout)`.
        unsafe { heap.dealloc(p, layout) };
        // `NumaHeap::stats`: "all zero for a node outside the machine"; an allocation there
        // gets nothing (a heap past the machine's nodes took node 0's memory).
        let small = Layout::from_size_align(64, 8).unwrap();
        assert!(
            heap.alloc_on(node(3), small).is_null(),
            "node 3 of 2 got memory"
        );
        assert_eq!(heap.stats(node(3)), HeapStats::default());
    }

    #[test]
    fn a_failed_heap_allocation_keeps_no_frames() {
        let spec = Spec::uniform(2, 2048, 0);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let frames = VecFrames::new(0, 4096);
        // SAFETY: nothing else frees the heap's blocks.
        let mut h = unsafe { NodeHeap::new(&m, &frames, node(1)) };
        let before = m.node(node(1)).unwrap().free_pages();
        // 4088 bytes in a heap growing by single frames: the first attempt grows one frame
        // and cannot place the allocation in it.
        let layout = Layout::from_size_align(4088, 8).unwrap();
        let got = h.alloc(layout, Order::ZERO);
        let s = h.stats();
        assert!(
            got.is_some() || s.frames == 0,
            "the allocation failed with {before} frames free, and the heap keeps {} frames \
             holding nothing: {s:?}",
            s.frames
        );
        if let Some(p) = got {
            // SAFETY: `p` came from `h` with `layout`.
            assert!(unsafe { h.dealloc(p, layout) });
        }
    }

    #[test]
    fn orders_fit_layouts() {
        let l = |s, a| Layout::from_size_align(s, a).unwrap();
        assert_eq!(order_for(l(1, 1)), Some(Order::ZERO));
        assert_eq!(order_for(l(4096, 4096)), Some(Order::ZERO));
        assert_eq!(order_for(l(4097, 8)), Some(Order::new(1)));
        assert_eq!(order_for(l(4096, 8192)), Some(Order::new(2)));
        assert_eq!(order_for(l(2 << 30, 8)), None);
    }
}
