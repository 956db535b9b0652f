//! The per-node heaps over the machine: two threads allocating and freeing through one
//! `NumaHeap` (its node heap's lock, then the machine's locks), and two `NodeHeap`s of one
//! node, one per thread, racing each other through the machine. Growth takes frames from the
//! node and an emptied chunk gives them back, so growth races frees of the other thread.
//!
//! In every interleaving no two live allocations overlap (each is filled with its own byte and
//! checked before it is freed), and once everything is freed the heaps hold no allocation and
//! every frame they gave back is free in the zone again, exactly once.
#![cfg(numaframe_loom)]

use std::alloc::{GlobalAlloc, Layout};
use std::ptr::NonNull;
use std::sync::OnceLock;

use loom::sync::Arc;
use numaframe::heap::FrameMap;
use numaframe::{Machine, NodeHeap, NodeId, NumaHeap, Order, PAGE_SIZE, PhysRange};
use numaframe_loom::{Tiny, keep, model, model_up_to, spawn};

const N0: NodeId = NodeId::new(0);
const FRAMES: u64 = 64;

/// Frames `0..FRAMES` backed by one page-aligned host buffer that lives for the whole test
/// (each model's iterations run one after another and reuse it).
#[derive(Debug)]
struct Frames(NonNull<u8>);

// SAFETY: the buffer is only reached through the pointers `map_frames` hands out, and the
// machine hands each frame to one heap at a time.
unsafe impl Sync for Frames {}
// SAFETY: as for Sync; the pointer is a handle to a buffer nothing else owns.
unsafe impl Send for Frames {}

impl Frames {
    fn get(cell: &'static OnceLock<Frames>) -> &'static Frames {
        cell.get_or_init(|| {
            let layout =
                Layout::from_size_align((FRAMES * PAGE_SIZE) as usize, 4096).expect("layout");
            // SAFETY: the layout has a non-zero size. The buffer is never freed: it lives as
            // long as the test.
            Frames(NonNull::new(unsafe { std::alloc::alloc(layout) }).expect("memory"))
        })
    }
}

// SAFETY: frame `f < FRAMES` maps to page `f` of the buffer: page aligned, valid for the
// buffer's (the program's) lifetime, and consecutive frames are consecutive pages.
unsafe impl FrameMap for Frames {
    fn map_frames(&self, range: PhysRange) -> Option<NonNull<u8>> {
        if range.end().get() > FRAMES {
            return None;
        }
        let offset = usize::try_from(range.start().get() * PAGE_SIZE).ok()?;
        // SAFETY: the range lies inside the buffer (checked above).
        NonNull::new(unsafe { self.0.as_ptr().add(offset) })
    }
}

fn current_node() -> NodeId {
    N0
}

/// A one-node machine, kept for the execution so that heaps over it can cross loom threads.
fn machine() -> &'static Machine<'static> {
    keep(Tiny::new(1, FRAMES, &[]).boot_kept())
}

/// An allocation of `size` bytes, filled with `tag` while it lives.
#[derive(Clone, Copy, Debug)]
struct Block {
    tag: u8,
    size: usize,
}

/// Most of a page: every such allocation needs a frame of its own.
const SMALL: usize = 3000;
/// More than a page: a block of order 1, which never merges with a chunk of order 0.
const LARGE: usize = 6000;

impl Block {
    fn layout(self) -> Layout {
        Layout::from_size_align(self.size, 8).expect("layout")
    }

    /// Fills the allocation at `p` with the tag.
    fn fill(self, p: NonNull<u8>) {
        // SAFETY: `p` is a live allocation of `self.size` bytes that only this thread uses.
        unsafe { p.as_ptr().write_bytes(self.tag, self.size) };
    }

    /// Checks that the allocation at `p` still holds only the tag: nothing else was handed
    /// the same bytes.
    fn intact(self, p: NonNull<u8>) {
        // SAFETY: as in `fill`.
        let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), self.size) };
        assert!(
            bytes.iter().all(|b| *b == self.tag),
            "allocation {} overlapped",
            self.tag
        );
    }
}

/// Checks the machine's invariants and that the node's free frames plus what the heaps still
/// hold make up all its memory.
fn settle(m: &Machine<'_>, held_by_heaps: u64) {
    m.check_invariants().expect("invariants");
    let node = m.node(N0).expect("node 0");
    assert_eq!(node.free_pages() + held_by_heaps, node.managed_pages());
}

/// Two threads on node 0 allocate through one `NumaHeap` that grows by as little as a frame:
/// one makes a one-frame allocation and frees it, the other a two-frame one (a chunk of its
/// own) and a one-frame one, and frees both. Emptied chunks go back to the machine while the
/// other thread grows the heap.
///
/// At two preemptions (17,618 executions, 11 s); three cost 212,133 (100 s).
#[test]
fn numa_heap_growth_races_frees() {
    static BUFFER: OnceLock<Frames> = OnceLock::new();
    model_up_to(2, || {
        let m = machine();
        let heap: Arc<NumaHeap<'static, 'static, 1>> = Arc::new(NumaHeap::new());
        // SAFETY: nothing else frees the heap's blocks.
        unsafe { heap.init(m, Frames::get(&BUFFER), current_node, Order::ZERO) }
            .expect("first init");
        let run = |heap: Arc<NumaHeap<'static, 'static, 1>>, blocks: &'static [Block]| {
            move || {
                let live: Vec<_> = blocks
                    .iter()
                    .map(|&b| {
                        let p =
                            NonNull::new(heap.alloc_on(N0, b.layout())).expect("node 0 has room");
                        b.fill(p);
                        (p, b)
                    })
                    .collect();
                for (p, b) in live {
                    b.intact(p);
                    // SAFETY: `p` came from this heap with `b.layout()` and is freed once.
                    unsafe { heap.dealloc(p.as_ptr(), b.layout()) };
                }
            }
        };
        let other = spawn(run(
            heap.clone(),
            &[Block {
                tag: 1,
                size: SMALL,
            }],
        ));
        run(
            heap.clone(),
            &[
                Block {
                    tag: 2,
                    size: LARGE,
                },
                Block {
                    tag: 3,
                    size: SMALL,
                },
            ],
        )();
        other.join().expect("thread");

        let stats = heap.stats(N0);
        assert_eq!(stats.used, 0, "{stats:?}");
        assert!(
            stats.chunks <= 1,
            "emptied chunks go back but the last: {stats:?}"
        );
        settle(m, stats.frames);
    });
}

/// Two `NodeHeap`s of node 0, one per thread, each growing by as little as a frame, making a
/// one-frame and a two-frame allocation, freeing them and dropping: their frames never overlap
/// and all of them come back.
#[test]
fn node_heaps_of_one_node_race_through_the_machine() {
    static BUFFER: OnceLock<Frames> = OnceLock::new();
    model(|| {
        let m = machine();
        let frames = Frames::get(&BUFFER);
        let run = move |tags: [u8; 2]| {
            move || {
                // SAFETY: nothing frees either heap's blocks but that heap.
                let mut h = unsafe { NodeHeap::new(m, frames, N0) };
                let blocks = [
                    Block {
                        tag: tags[0],
                        size: SMALL,
                    },
                    Block {
                        tag: tags[1],
                        size: LARGE,
                    },
                ];
                let live = blocks.map(|b| {
                    let p = h.alloc(b.layout(), Order::ZERO).expect("node 0 has room");
                    b.fill(p);
                    (p, b)
                });
                for (p, b) in live {
                    b.intact(p);
                    // SAFETY: `p` came from `h` with `b.layout()` and is freed once.
                    assert!(unsafe { h.dealloc(p, b.layout()) });
                }
                assert_eq!(h.stats().used, 0);
            }
        };
        let other = spawn(run([1, 2]));
        run([3, 4])();
        other.join().expect("thread");
        settle(m, 0);
    });
}
