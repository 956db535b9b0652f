//! The allocators numaframe is measured against, behind the one interface every scenario
//! drives ([`Frames`]), and the wrappers the threaded scenarios put them in ([`Padded`],
//! [`Locked`]).
#![deny(unsafe_code)]

use bitmap_allocator::{BitAlloc, BitAlloc1M};
use free_list::{FreeList, PageLayout, PageRange};
use numaframe::{PAGE_SIZE, Pfn};

/// A frame allocator as the scenarios drive it: frame numbers in, frame numbers out.
pub trait Frames {
    /// One block of `2^order` frames; `None` when none is left.
    fn alloc(&mut self, order: u8) -> Option<u64>;
    /// Gives back a block from [`Frames::alloc`] with the same order.
    fn free(&mut self, frame: u64, order: u8);
    /// An order-0 frame the caller will free soon (an I/O buffer). The default is a plain
    /// allocation: only numaframe has lifetime classes.
    fn alloc_short_lived(&mut self) -> Option<u64> {
        self.alloc(0)
    }
    /// Fills `out` with order-0 frames; returns how many it placed. The default loops single
    /// allocations, as a peer's user would.
    fn alloc_bulk(&mut self, out: &mut [Pfn]) -> usize {
        for (i, slot) in out.iter_mut().enumerate() {
            match self.alloc(0) {
                Some(f) => *slot = Pfn::new(f),
                None => return i,
            }
        }
        out.len()
    }
    /// Frees order-0 frames; the default loops single frees.
    fn free_bulk(&mut self, frames: &[Pfn]) {
        for f in frames {
            self.free(f.get(), 0);
        }
    }
    /// Calls `f` with the first frame and the free frames of each 2 MiB pageblock of the
    /// memory the allocator manages, so that a caller's record of held frames can count the
    /// frames the allocator keeps for itself (numaframe's metadata pool) as not free. The
    /// default reports nothing: the peers keep their metadata outside that memory.
    fn pageblock_free(&self, f: &mut dyn FnMut(u64, u16)) {
        let _ = f;
    }
}

/// The floor: a `Vec<u64>` stack of free frame numbers, order 0 only.
#[derive(Debug)]
pub struct Floor(Vec<u64>);

impl Floor {
    /// Frames `0..frames`, handed out lowest first.
    pub fn new(frames: u64) -> Floor {
        Floor((0..frames).rev().collect())
    }
    /// How many frames it holds free.
    pub fn free_frames(&self) -> usize {
        self.0.len()
    }
}

impl Frames for Floor {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        if order != 0 {
            return None;
        }
        self.0.pop()
    }
    fn free(&mut self, frame: u64, _order: u8) {
        self.0.push(frame);
    }
}

/// `buddy_system_allocator::FrameAllocator` with orders up to 18.
pub struct Buddy(buddy_system_allocator::FrameAllocator<19>);

impl std::fmt::Debug for Buddy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buddy").finish_non_exhaustive()
    }
}

impl Buddy {
    /// Frames `0..frames`.
    pub fn new(frames: u64) -> Buddy {
        let mut a = buddy_system_allocator::FrameAllocator::<19>::new();
        a.add_frame(0, frames as usize);
        Buddy(a)
    }
}

impl Frames for Buddy {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        self.0.alloc(1 << order).map(|f| f as u64)
    }
    fn free(&mut self, frame: u64, order: u8) {
        self.0.dealloc(frame as usize, 1 << order);
    }
}

/// `bitmap_allocator`'s segment tree of `B` bits, by default `BitAlloc1M` (2^20 bits, the
/// smallest size that covers 1 GiB of frames).
pub struct Bitmap<B = BitAlloc1M>(Box<B>);

impl<B> std::fmt::Debug for Bitmap<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bitmap").finish_non_exhaustive()
    }
}

impl<B: BitAlloc> Bitmap<B> {
    /// Frames `0..frames` (at most `B::CAP`).
    pub fn new(frames: u64) -> Bitmap<B> {
        let mut a = Box::new(B::DEFAULT);
        a.insert(0..frames as usize);
        Bitmap(a)
    }
}

impl<B: BitAlloc> Frames for Bitmap<B> {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        let f = if order == 0 {
            self.0.alloc()
        } else {
            self.0
                .alloc_contiguous(None, 1 << order, usize::from(order))
        };
        f.map(|f| f as u64)
    }
    fn free(&mut self, frame: u64, order: u8) {
        if order == 0 {
            self.0.dealloc(frame as usize);
        } else {
            self.0.dealloc_contiguous(frame as usize, 1 << order);
        }
    }
}

/// `free_list::FreeList` with 16 ranges inline.
#[derive(Debug)]
pub struct FreeListPeer(FreeList<16>);

impl FreeListPeer {
    /// Frames `0..frames`.
    pub fn new(frames: u64) -> FreeListPeer {
        let mut list = FreeList::new();
        let all = PageRange::new(0, (frames * PAGE_SIZE) as usize).expect("a non-empty range");
        give_back(&mut list, all);
        FreeListPeer(list)
    }
}

/// The one unsafe call in this module: `FreeList::deallocate` trusts that the range is free to
/// hand out again.
#[allow(unsafe_code)]
fn give_back(list: &mut FreeList<16>, range: PageRange) {
    // SAFETY: `range` names simulated frame numbers only (no memory is behind them), and it is
    // either the initial range or a range this list handed out and the benchmark no longer uses.
    let r = unsafe { list.deallocate(range) };
    r.expect("free-list refused a range it handed out");
}

impl Frames for FreeListPeer {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        let bytes = (PAGE_SIZE as usize) << order;
        let layout = PageLayout::from_size_align(bytes, bytes).ok()?;
        self.0
            .allocate(layout)
            .ok()
            .map(|r| (r.start() / PAGE_SIZE as usize) as u64)
    }
    fn free(&mut self, frame: u64, order: u8) {
        let range =
            PageRange::from_start_len((frame * PAGE_SIZE) as usize, (PAGE_SIZE as usize) << order)
                .expect("a range this list handed out");
        give_back(&mut self.0, range);
    }
}

/// An allocator alone on its cache lines (128 bytes, two lines for the adjacent-line
/// prefetcher), so that per-thread instances in one array share nothing.
#[derive(Debug)]
#[repr(align(128))]
pub struct Padded<A>(pub A);

impl<A: Frames> Frames for Padded<A> {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        self.0.alloc(order)
    }
    fn free(&mut self, frame: u64, order: u8) {
        self.0.free(frame, order);
    }
}

/// A peer behind a `spin::Mutex`, locked for every call, as its users share it between CPUs.
#[derive(Debug)]
pub struct Locked<'l, A>(pub &'l spin::Mutex<A>);

impl<A: Frames> Frames for Locked<'_, A> {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        self.0.lock().alloc(order)
    }
    fn free(&mut self, frame: u64, order: u8) {
        self.0.lock().free(frame, order);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::numa::managed;
    use crate::bench::{NODE_BASE, NumaCpu, OneNode, Rng, set_caches};

    /// Every peer, driven through `Frames`, hands out each frame once and takes it back.
    fn round_trip(a: &mut dyn Frames, first: u64, frames: u64, orders: &[u8]) {
        let mut held = Vec::new();
        while let Some(f) = a.alloc(0) {
            assert!(
                (first..first + frames).contains(&f),
                "frame {f} outside {first}..+{frames}"
            );
            held.push(f);
        }
        let mut sorted = held.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len() as u64, frames, "every frame once");
        Rng::new(9).shuffle(&mut held);
        for &f in &held {
            a.free(f, 0);
        }
        for &order in orders {
            let f = a.alloc(order).expect("a free allocator has a block");
            assert_eq!(f % (1 << order), 0, "order {order} aligned");
            a.free(f, order);
        }
        let mut out = vec![Pfn::new(0); 64];
        assert_eq!(a.alloc_bulk(&mut out), 64);
        a.free_bulk(&out);
        let all: Vec<u64> = std::iter::from_fn(|| a.alloc(0)).collect();
        assert_eq!(all.len() as u64, frames, "everything came back");
        for f in all {
            a.free(f, 0);
        }
    }

    #[test]
    fn peers_round_trip() {
        let n = 1 << 12;
        round_trip(&mut Buddy::new(n), 0, n, &[9, 12]);
        round_trip(&mut Bitmap::<BitAlloc1M>::new(n), 0, n, &[9, 12]);
        round_trip(&mut FreeListPeer::new(n), 0, n, &[9, 12]);
        round_trip(&mut Floor::new(n), 0, n, &[]);
        let lock = spin::Mutex::new(Floor::new(n));
        round_trip(&mut Locked(&lock), 0, n, &[]);
    }

    #[test]
    fn numaframe_adapters_round_trip() {
        let node = OneNode::new(1 << 12).unwrap();
        let m = node.boot().unwrap();
        let n = managed(&m);
        assert!(n >= 1 << 12);
        // The node starts at 4 GiB, its usable frames first.
        let first = NODE_BASE / PAGE_SIZE;
        round_trip(&mut NumaCpu::new(&m, 1), first, n, &[9, 12]);
        set_caches(&m, false);
        round_trip(&mut NumaCpu::new(&m, 0), first, n, &[9, 12]);
        m.check_invariants().unwrap();
    }
}
