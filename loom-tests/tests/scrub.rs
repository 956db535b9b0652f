//! Background scrubbing racing the zone: `Machine::scrub` takes a dirty free unit off its zone,
//! clears it with the lock dropped, and puts it back clean, while other threads allocate the
//! same frames (with `ZERO`: they must get them cleared, or take them before the scrub does
//! and the scrub gives up) or free a block whose buddy the scrub holds (the merge happens when
//! the scrub puts its unit back).
//!
//! Frame contents live in [`Frames`], one byte per frame: an owner writes its tag, the clearer
//! zeroes. In every interleaving a frame handed out with `ZERO` reads as zero and keeps what its
//! owner wrote until it is freed, no frame is lost or handed out twice (every frame is free at
//! the end), the invariant walk agrees with the counters, and once a final scrub has run every
//! free frame the machine holds as clean reads as zero.
//!
//! Every model runs at one preemption (13 s for the four). At two, an execution runs past loom's branch limit: an
//! allocation waiting for a scrub polls the zone lock in a loop, and loom may let the scrubbing
//! thread's relaxed look at the lock word (before its compare-exchange) read it as held for
//! ever, an execution without end that no hardware runs.
#![cfg(numaframe_loom)]

use std::sync::Mutex;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use numaframe::{AllocFlags, FrameClearer, Machine, NodeId, Order, Pfn, PhysRange, ZoneKind};
use numaframe_loom::{Tiny, assert_all_free, keep, leave_free, model_up_to, race, spawn};

const N0: NodeId = NodeId::new(0);
/// What boot memory holds: data of nobody the machine knows, dirty.
const GARBAGE: u8 = 0xff;

/// The contents of every frame of the machine, one byte standing for all its bytes (0: reads
/// as zero). The clearer zeroes them; a model thread writes its tag into the frames it owns.
#[derive(Debug)]
struct Frames {
    bytes: Mutex<Vec<u8>>,
    /// Bumped by every clear and every owner's access, so that loom orders them against each
    /// other (the bytes are behind a plain mutex it does not see).
    touched: AtomicUsize,
}

impl Frames {
    fn new(frames: u64) -> Frames {
        Frames {
            bytes: Mutex::new(vec![GARBAGE; frames as usize]),
            touched: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        // Relaxed: the counter orders nothing; only its conflicts matter to loom.
        self.touched.fetch_add(1, Ordering::Relaxed);
    }

    /// The owner of `frames` frames from `pfn` writes `tag` over them.
    fn write(&self, pfn: Pfn, frames: u64, tag: u8) {
        self.touch();
        let mut b = self.bytes.lock().expect("frames");
        b[pfn.get() as usize..(pfn.get() + frames) as usize].fill(tag);
    }

    /// `true` if every one of `frames` frames from `pfn` holds `byte`.
    fn all(&self, pfn: Pfn, frames: u64, byte: u8) -> bool {
        self.touch();
        let b = self.bytes.lock().expect("frames");
        b[pfn.get() as usize..(pfn.get() + frames) as usize]
            .iter()
            .all(|&x| x == byte)
    }
}

impl FrameClearer for Frames {
    fn clear(&self, range: PhysRange) {
        self.touch();
        let mut b = self.bytes.lock().expect("frames");
        b[range.start().get() as usize..range.end().get() as usize].fill(0);
    }
}

/// One node of `frames` frames, all boot memory dirty, clearing through a [`Frames`].
fn setup(frames: u64) -> (Arc<Machine<'static>>, &'static Frames) {
    let contents = keep(Frames::new(frames));
    let m = Tiny::new(1, frames, &[]).boot_kept().with_clearer(contents);
    (Arc::new(m), contents)
}

/// Every free block of node 0 (by its buddyinfo, so no allocation fails; blocks above order 9
/// as order-9 blocks), each written with `tag` by its new owner. Returns the blocks.
fn take_all(m: &Machine<'_>, frames: &Frames, tag: u8) -> Vec<(Pfn, Order)> {
    let zone = m.node(N0).expect("node 0").zone(ZoneKind::Dma32);
    let mut held = Vec::new();
    for (order, &count) in zone.buddyinfo().iter().enumerate().rev() {
        let (order, count) = if order > 9 {
            (Order::new(9), count << (order - 9))
        } else {
            (Order::new(order as u8), count)
        };
        for _ in 0..count {
            let p = m
                .alloc(N0, order, AllocFlags::THISNODE)
                .expect("a free block");
            frames.write(p, order.frames(), tag);
            held.push((p, order));
        }
    }
    assert_eq!(zone.counters().free, 0);
    held
}

/// After the race: the invariants hold; a scrub to the end leaves nothing dirty, and then every
/// free frame reads as zero (none the machine holds as clean keeps data); freeing what the
/// model holds brings every frame back.
fn settle(m: &Machine<'_>, frames: &Frames, held: Vec<(Pfn, Order)>) {
    m.check_invariants().expect("invariants");
    let node = m.node(N0).expect("node 0");
    assert!(node.dirty_pages() <= node.free_pages());
    assert_eq!(m.scrub(N0, u64::MAX), 0, "one scrub of the whole node");
    assert_eq!(node.dirty_pages(), 0);
    let rest = take_all_clean(m, frames);
    for (p, order) in held.into_iter().chain(rest) {
        m.free(p, order).expect("own block");
    }
    assert_all_free(m);
}

/// Every free block of node 0, each checked to read as zero.
fn take_all_clean(m: &Machine<'_>, frames: &Frames) -> Vec<(Pfn, Order)> {
    let zone = m.node(N0).expect("node 0").zone(ZoneKind::Dma32);
    let mut got = Vec::new();
    for (order, &count) in zone.buddyinfo().iter().enumerate().rev() {
        let order = Order::new(order as u8);
        for _ in 0..count {
            let p = m
                .alloc(N0, order, AllocFlags::THISNODE)
                .expect("a free block");
            assert!(
                frames.all(p, order.frames(), 0),
                "{p:?} (order {order:?}) is free, not dirty, and holds data"
            );
            got.push((p, order));
        }
    }
    got
}

/// Frees one held block of `order`, dirty: the only free block.
fn free_one(m: &Machine<'_>, held: &mut Vec<(Pfn, Order)>, order: Order) {
    let i = held
        .iter()
        .position(|&(_, o)| o == order)
        .expect("a held block of the order");
    let (p, o) = held.remove(i);
    m.free(p, o).expect("own block");
    let zone = m.node(N0).expect("node 0").zone(ZoneKind::Dma32);
    assert_eq!(zone.counters().free, order.frames());
}

/// A zeroed allocation of an order-0 frame races a scrub of the split pageblock that holds
/// the only two free frames (both dirty): the scrub takes them as frames of the pageblock, so
/// the allocation either takes one first or waits for the scrub to give them back. It gets a
/// frame that reads as zero, and the scrub never clears it under its owner.
#[test]
fn zeroed_frame_races_a_scrub_of_its_pageblock() {
    model_up_to(1, || {
        let (m, frames) = setup(64);
        let mut held = leave_free(&m, N0, 2);
        let (p, left) = race(
            {
                let m = m.clone();
                move || m.scrub(N0, 2)
            },
            || {
                let p = m
                    .alloc(N0, Order::ZERO, AllocFlags::ZERO | AllocFlags::THISNODE)
                    .expect("two frames are free: a held one comes back");
                assert!(frames.all(p, 1, 0), "{p:?} was handed out dirty");
                frames.write(p, 1, 2);
                p
            },
        );
        // What was dirty when the scrub returned: the allocation may not have taken its frame yet.
        assert!(left <= 2, "two free frames, {left} dirty");
        assert!(
            frames.all(p, 1, 2),
            "the scrub cleared {p:?} under its owner"
        );
        held.push((p, Order::ZERO));
        settle(&m, frames, held);
    });
}

/// A zeroed order-9 allocation races a scrub of the only free 2 MiB block (dirty): the scrub
/// takes it whole and clears it in one call, so the allocation takes it first or waits.
#[test]
fn zeroed_block_races_a_scrub_of_it() {
    model_up_to(1, || {
        let (m, frames) = setup(2048);
        let order = Order::new(9);
        let mut held = take_all(&m, frames, 1);
        free_one(&m, &mut held, order);
        let (p, left) = race(
            {
                let m = m.clone();
                move || m.scrub(N0, 512)
            },
            || {
                let p = m
                    .alloc(N0, order, AllocFlags::ZERO | AllocFlags::THISNODE)
                    .expect("the only free block comes back from the scrub");
                assert!(frames.all(p, 512, 0), "{p:?} was handed out dirty");
                frames.write(p, 512, 2);
                p
            },
        );
        assert!(left == 0 || left == 512, "one free block, {left} dirty");
        assert!(
            frames.all(p, 512, 2),
            "the scrub cleared {p:?} under its owner"
        );
        held.push((p, order));
        settle(&m, frames, held);
    });
}

/// A free of an order-9 block races a scrub of its dirty buddy: if the free comes first the
/// two merge and the scrub takes the merged block (and clears half of it, its budget); if the
/// scrub holds the buddy, the free cannot merge with it, and the merge happens when the scrub
/// puts it back.
#[test]
fn free_races_a_scrub_of_its_buddy() {
    model_up_to(1, || {
        let (m, frames) = setup(2048);
        let order = Order::new(9);
        let mut held = take_all(&m, frames, 1);
        let mut blocks: Vec<Pfn> = held
            .iter()
            .filter(|&&(_, o)| o == order)
            .map(|&(p, _)| p)
            .collect();
        blocks.sort();
        let (low, high) = (blocks[0], blocks[1]);
        assert!(
            low.get() % 1024 == 0 && high.get() == low.get() + 512,
            "two buddies"
        );
        held.retain(|&(p, _)| p != low && p != high);
        m.free(low, order).expect("own block");
        let ((), left) = race(
            {
                let m = m.clone();
                move || m.scrub(N0, 512)
            },
            || m.free(high, order).expect("own block"),
        );
        // Dirty when the scrub returned: none if it cleaned the first block before the free.
        assert!(left == 0 || left == 512, "{left} dirty");
        // Whichever came first, one half is clean and the other dirty, and they merged.
        let zone = m.node(N0).expect("node 0").zone(ZoneKind::Dma32);
        assert_eq!(zone.counters().dirty, 512);
        assert_eq!(zone.buddyinfo()[10], 1, "the buddies merged");
        settle(&m, frames, held);
    });
}

/// Two scrubs of the same node race a zeroed allocation of one of its two dirty frames: at
/// most one scrub holds a unit of the zone at a time, and the allocation still gets a cleared
/// frame.
#[test]
fn two_scrubs_race_a_zeroed_frame() {
    model_up_to(1, || {
        let (m, frames) = setup(64);
        let mut held = leave_free(&m, N0, 2);
        let scrub = {
            let m = m.clone();
            spawn(move || m.scrub(N0, 1))
        };
        let other = {
            let m = m.clone();
            spawn(move || m.scrub(N0, 1))
        };
        let p = m
            .alloc(N0, Order::ZERO, AllocFlags::ZERO | AllocFlags::THISNODE)
            .expect("two frames are free");
        assert!(frames.all(p, 1, 0), "{p:?} was handed out dirty");
        frames.write(p, 1, 2);
        scrub.join().expect("scrub");
        other.join().expect("scrub");
        assert!(frames.all(p, 1, 2), "a scrub cleared {p:?} under its owner");
        held.push((p, Order::ZERO));
        settle(&m, frames, held);
    });
}
